"""The model a run trains: loading or building it, the adapters and the 4-bit base, the patches
apply makes to its forward (activation offload, chunked loss), the base's files and the final directory."""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "load_model": "gpuplan.apply.model.load",
    "Loaded": "gpuplan.apply.model.generation",
    "generate": "gpuplan.apply.model.generation",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
