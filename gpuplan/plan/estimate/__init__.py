"""Pure cost models: bytes and seconds for a resolved workload. They never import the engine.

memory/           bytes per GPU, part by part
throughput.py     FLOPs, step time and tokens per second
step_time/        the step-time model: named terms combined roofline-style
communication.py  gradient all-reduce / sharded collectives per step
calibration.py    measured runs that scale the step-time model's terms
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "estimate_memory": "gpuplan.plan.estimate.memory",
    "estimate_throughput": "gpuplan.plan.estimate.throughput",
    "communication": "gpuplan.plan.estimate.communication",
    "step_time": "gpuplan.plan.estimate.step_time",
    "calibrated_scale": "gpuplan.plan.estimate.calibration",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
