"""Pure cost models: bytes and seconds for a resolved workload. They never import the engine.

memory/           bytes per GPU, part by part
throughput.py     step time and tokens per second
efficiency.py     the achievable fraction of peak per GPU generation
communication.py  gradient all-reduce / sharded collectives per step
calibration.py    measured runs that replace the default efficiency
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "estimate_memory": "gpuplan.plan.estimate.memory",
    "estimate_throughput": "gpuplan.plan.estimate.throughput",
    "communication": "gpuplan.plan.estimate.communication",
    "default_efficiency": "gpuplan.plan.estimate.efficiency",
    "calibrated_efficiency": "gpuplan.plan.estimate.calibration",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
