"""How a plan's training processes start and what they check first: the launcher per backend,
torchrun's command lines, one rank's entry point, the run lock and resume point around them,
the packages and the device a plan needs."""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "Launcher": "gpuplan.apply.launch.backends",
    "launcher_for": "gpuplan.apply.launch.backends",
    "apply_plan": "gpuplan.apply.launch.session",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
