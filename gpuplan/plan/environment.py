"""What the machine that plans knows about its software, read without importing it.

Package versions come from installed metadata (importlib.metadata), so asking
whether bitsandbytes or torch is there never imports them (DESIGN principle 3).
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

# Packages whose presence changes the plan or its fingerprint.
WATCHED = (
    "torch", "transformers", "accelerate", "bitsandbytes", "flash_attn", "deepspeed", "datasets",
    "torchao", "galore_torch", "apollo_torch", "lomo_optim", "grokadamw", "schedulefree",
    "torch_optimi", "torchdistx", "tvm", "liger_kernel",
)
_DIST_NAMES = {"flash_attn": "flash-attn", "galore_torch": "galore-torch", "apollo_torch": "apollo-torch",
               "lomo_optim": "lomo-optim", "torch_optimi": "torch-optimi", "liger_kernel": "liger-kernel"}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in WATCHED:
        try:
            out[name] = metadata.version(_DIST_NAMES.get(name, name))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cuda_version(torch_version: str | None) -> str | None:
    """CUDA version a torch wheel was built for, from its local tag (2.13.0+cu128 -> 12.8)."""
    if not torch_version or "+cu" not in torch_version:
        return None
    tag = torch_version.split("+cu", 1)[1]
    return f"{tag[:-1]}.{tag[-1]}" if tag.isdigit() and len(tag) >= 3 else None


def local_environment() -> dict[str, Any]:
    from gpuplan.hardware.detect import host_memory_bytes  # /proc/meminfo and cgroups: no torch

    from gpuplan.spec.trackers import installed_trackers

    packages = package_versions()
    return {
        "trackers": installed_trackers(),
        "host_memory_bytes": host_memory_bytes(),
        "packages": packages,
        "cuda": cuda_version(packages.get("torch")),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    }
