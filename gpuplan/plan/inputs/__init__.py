"""What a plan reads besides the spec: the machine it is made on and the Hub pins.

environment.py  Environment: this machine's packages, cores and RAM (a frozen record)
target.py       which of those a plan for named hardware may use (is_local, target_packages)
sources.py      Hub ids: resolved through the cache and pinned by the lock file
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "local_environment": "gpuplan.plan.inputs.environment",
    "is_local": "gpuplan.plan.inputs.target",
    "target_packages": "gpuplan.plan.inputs.target",
    "resolve_sources": "gpuplan.plan.inputs.sources",
    "source_settings": "gpuplan.plan.inputs.sources",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
