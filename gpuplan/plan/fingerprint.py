"""A plan's fingerprint: what must be unchanged for a saved plan to still be valid.

The spec's hash, a hash of the resolved values, the hardware identity and the
versions of the packages that execute it (torch, transformers, bitsandbytes, CUDA).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuplan.plan.types import Plan

if TYPE_CHECKING:
    from gpuplan.plan.inputs.environment import Environment

VERSIONED = ("torch", "transformers", "bitsandbytes", "accelerate")


def settings_sha256(plan: Plan) -> str:
    values = {k: s.value for k, s in sorted(plan.settings.items())}
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(plan: Plan, environment: Environment) -> dict[str, Any]:
    packages = environment.packages
    hw = plan.hardware
    return {
        "spec_sha256": plan.spec_sha256,
        "settings_sha256": settings_sha256(plan),
        "hardware": {
            "name": hw.name,
            "memory_bytes": hw.memory_bytes,
            "compute_capability": list(hw.compute_capability) if hw.compute_capability else None,
            "count": hw.count,
            "nodes": hw.nodes,
        },
        "versions": {**{k: packages.get(k) for k in VERSIONED}, "cuda": environment.cuda},
    }


def stale_reasons(
    plan: Plan, *, spec_sha256_now: str | None, hardware_now: Mapping[str, Any] | None, environment_now: Environment | None
) -> list[str]:
    """Why a saved plan no longer describes this run (empty: it is current).

    spec_sha256_now: hash of the spec file now (None: the file is gone).
    hardware_now: the detected device's profile dict (None: not checked).
    environment_now: the packages here (None: not checked; a plan handed off to a cluster is checked there).
    """
    fp = plan.fingerprint
    reasons: list[str] = []
    if not fp:
        return ["the plan has no fingerprint (made by an older gpuplan or edited): plan again"]
    if fp.get("settings_sha256") != settings_sha256(plan):
        reasons.append("the plan's settings were edited after it was made")
    if plan.spec_path and fp.get("spec_sha256"):
        if spec_sha256_now is None:
            reasons.append(f"the spec {plan.spec_path} no longer exists")
        elif spec_sha256_now != fp["spec_sha256"]:
            reasons.append(f"the spec {plan.spec_path} was edited since the plan was made")
    if hardware_now is not None:
        want = fp.get("hardware", {})
        if want.get("name") != hardware_now.get("name"):
            reasons.append(f"planned for {want.get('name')}, this machine has {hardware_now.get('name')}")
        elif want.get("compute_capability") != hardware_now.get("compute_capability"):
            reasons.append(f"compute capability {want.get('compute_capability')} planned, {hardware_now.get('compute_capability')} here")
    if environment_now is None:
        return reasons
    now = {**{k: environment_now.packages.get(k) for k in VERSIONED}, "cuda": environment_now.cuda}
    for name, planned in fp.get("versions", {}).items():
        if planned != now.get(name):
            reasons.append(f"{name} {planned or 'absent'} when planned, {now.get(name) or 'absent'} now")
    return reasons
