"""A plan's fingerprint: what must be unchanged for a saved plan to still be valid.

The spec's hash, a hash of the resolved values, the hardware identity and the
versions of the packages that execute it (torch, transformers, bitsandbytes, CUDA).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from gpuplan.plan.types import Plan

VERSIONED = ("torch", "transformers", "bitsandbytes", "accelerate")


def settings_sha256(plan: Plan) -> str:
    values = {k: s.value for k, s in sorted(plan.settings.items())}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(plan: Plan, environment: Mapping[str, Any]) -> dict[str, Any]:
    packages = environment.get("packages", {})
    hw = plan.hardware
    return {
        "spec_sha256": plan.spec_sha256,
        "settings_sha256": settings_sha256(plan),
        "hardware": {"name": hw.get("name"), "memory_bytes": hw.get("memory_bytes"),
                     "compute_capability": hw.get("compute_capability"),
                     "count": hw.get("count"), "nodes": hw.get("nodes")},
        "versions": {**{k: packages.get(k) for k in VERSIONED}, "cuda": environment.get("cuda")},
    }
