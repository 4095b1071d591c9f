"""The hardware as an input to planning: the GPU catalog and local detection, no torch.

lookup(name, memory_gib=None) -> GPUProfile   (catalog.py over catalog.toml)
detect() -> (GPUProfile, how)                 (detect.py: nvidia-smi, rocm-smi, or the CPU)
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "GPUProfile": "gpuplan.hardware.profile",
    "AmbiguousGPUError": "gpuplan.hardware.catalog",
    "UnknownGPUError": "gpuplan.hardware.catalog",
    "load_catalog": "gpuplan.hardware.catalog",
    "lookup": "gpuplan.hardware.catalog",
    "detect": "gpuplan.hardware.detect",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
