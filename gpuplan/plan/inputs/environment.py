"""What the machine that plans knows about its software, read without importing it.

Package versions come from installed metadata (importlib.metadata), so asking
whether bitsandbytes or torch is there never imports them (docs/design.md principle 3).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

# Packages whose presence changes the plan or its fingerprint.
WATCHED = (
    "torch",
    "transformers",
    "accelerate",
    "bitsandbytes",
    "flash_attn",
    "deepspeed",
    "datasets",
    "torchao",
    "galore_torch",
    "apollo_torch",
    "lomo_optim",
    "grokadamw",
    "schedulefree",
    "torch_optimi",
    "torchdistx",
    "tvm",
    "liger_kernel",
)
# The pip (distribution) name of each watched module where the two differ: what `pip install` takes.
PIP_NAMES = {
    "flash_attn": "flash-attn",
    "galore_torch": "galore-torch",
    "apollo_torch": "apollo-torch",
    "lomo_optim": "lomo-optim",
    "torch_optimi": "torch-optimi",
    "liger_kernel": "liger-kernel",
}


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in WATCHED:
        try:
            out[name] = metadata.version(PIP_NAMES.get(name, name))
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cuda_version(torch_version: str | None) -> str | None:
    """CUDA version a torch wheel was built for, from its local tag (2.13.0+cu128 -> 12.8)."""
    if not torch_version or "+cu" not in torch_version:
        return None
    tag = torch_version.split("+cu", 1)[1]
    return f"{tag[:-1]}.{tag[-1]}" if tag.isdigit() and len(tag) >= 3 else None


@dataclass(frozen=True)
class Environment:
    """The machine that makes the plan: what is installed, its cores and RAM.

    Rules use it only where the plan is for this machine (inputs/target.py) or for what gpuplan
    chooses itself; `None` is unknown (a test environment, a machine that does not say)."""

    packages: Mapping[str, str | None] = field(default_factory=dict)  # WATCHED name -> version, None if absent
    trackers: Mapping[str, bool] | None = None  # experiment tracker -> installed (spec/trackers.py)
    host_memory_bytes: int | None = None
    cuda: str | None = None  # the CUDA version torch was built for
    cpu_count: int | None = None

    @classmethod
    def of(cls, value: Environment | Mapping[str, Any]) -> Environment:
        """An Environment, from one or from its dict form (tests and saved fixtures)."""
        if isinstance(value, Environment):
            return value
        unknown = set(value) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise TypeError(f"unknown environment fields: {sorted(unknown)}")
        trackers = value.get("trackers")
        return cls(
            packages=dict(value.get("packages") or {}),
            trackers=None if trackers is None else dict(trackers),
            host_memory_bytes=value.get("host_memory_bytes"),
            cuda=value.get("cuda"),
            cpu_count=value.get("cpu_count"),
        )

    def has(self, package: str) -> bool:
        return bool(self.packages.get(package))


EnvironmentLike = Environment | Mapping[str, Any]  # what the planning entry points accept


def local_environment() -> Environment:
    from gpuplan.hardware.detect import host_memory_bytes  # /proc/meminfo and cgroups: no torch
    from gpuplan.spec.trackers import installed_trackers

    packages = package_versions()
    return Environment(
        packages=packages,
        trackers=installed_trackers(),
        host_memory_bytes=host_memory_bytes(),
        cuda=cuda_version(packages.get("torch")),
        cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    )
