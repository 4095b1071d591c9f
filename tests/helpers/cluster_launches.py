"""The shipped multi-node spec's plan with [launch] set for each engine, as docs/clusters.md renders it.

The spec's own [launch] is Slurm's; the other engines get the same plan with their launch settings
(dataclasses.replace of plan.resolved.launch, which is what job_for(plan, launch) reads).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuplan.plan.resolved import LaunchSettings
from gpuplan.plan.types import Plan
from tests.helpers.planning import SPECS

MULTI_NODE_SPEC = SPECS / "llama-8b-2nodes-slurm.toml"
IMAGE = "ghcr.io/example/gpuplan:0.1"
BUCKET = "s3://my-bucket"  # SkyPilot's VMs share no file system: the bucket it mounts at launch.storage
# each engine's own [launch] keys, as docs/clusters.md writes them
ENGINE_LAUNCH: dict[str, dict[str, Any]] = {
    "kubernetes": {"image": IMAGE, "namespace": "ml", "queue": "team-a", "storage_claim": "shared-pvc", "kubernetes_api": "trainjob"},
    "skypilot": {"image": IMAGE, "spot": True, "storage_bucket": BUCKET},
    "ray": {},
}
_SLURM_ONLY = {"partition": None, "account": None, "qos": None}


def launch_for(plan: Plan, target: str, **changes: Any) -> LaunchSettings:
    """plan's [launch] moved to `target` with that engine's keys (and `changes` on top)."""
    return dataclasses.replace(plan.resolved.launch, target=target, **{**_SLURM_ONLY, **ENGINE_LAUNCH[target], **changes})
