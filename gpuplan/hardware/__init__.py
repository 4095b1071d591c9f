"""The hardware as an input to planning: the GPU catalog and local detection, no torch.

    lookup(name, memory_gib=None) -> GPUProfile   (catalog.py over catalog.toml)
    detect() -> (GPUProfile, how)                 (detect.py: nvidia-smi, rocm-smi, or the CPU)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "GPUProfile": "gpuplan.hardware.profile",
    "AmbiguousGPUError": "gpuplan.hardware.catalog",
    "UnknownGPUError": "gpuplan.hardware.catalog",
    "load_catalog": "gpuplan.hardware.catalog",
    "lookup": "gpuplan.hardware.catalog",
    "detect": "gpuplan.hardware.detect",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import on first use: naming the API costs no import time (tests/test_plan_imports.py)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
