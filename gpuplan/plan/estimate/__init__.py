"""Pure cost models: bytes and seconds for a resolved workload. They never import the engine.

memory/           bytes per GPU, part by part
throughput.py     FLOPs, step time and tokens per second
step_time/        the step-time model: named terms combined roofline-style
comm_volumes.py   the bytes the data-parallel collectives move per step
comm_time.py      their seconds: the links, the sharded terms, the overlap the step time gives them
calibration.py    measured runs that scale the step-time model's terms
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "estimate_memory": "gpuplan.plan.estimate.memory",
    "estimate_throughput": "gpuplan.plan.estimate.throughput",
    "communication": "gpuplan.plan.estimate.comm_time",
    "step_time": "gpuplan.plan.estimate.step_time",
    "calibrated_scale": "gpuplan.plan.estimate.calibration",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
