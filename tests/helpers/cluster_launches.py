"""The shipped multi-node spec's plan with [launch] set for each engine, as docs/clusters.md renders it.

The spec's own [launch] is Slurm's; the other engines get the same plan with their launch settings
(dataclasses.replace of plan.resolved.launch, which is what job_for(plan, launch) reads).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpuplan.plan.resolved import LaunchSettings
from gpuplan.plan.types import Plan
from tests.helpers.planning import MODELS, SPECS

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


def cluster_spec(tmp_path: Path, launch: str, *, name: str = "cluster", nodes: int = 2) -> Path:
    """A spec a user hands to an engine: Llama 3.1 8B on `nodes` x 8 H100-80GB, its output.dir on the shared
    storage (tmp_path/shared, launch.storage); `launch` is the [launch] section's lines (target and engine keys)."""
    shared = tmp_path / "shared"
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[model]
config = "{MODELS / "llama-3.1-8b.json"}"
dtype = "bfloat16"
[hardware]
gpu = "H100-80GB"
count = 8
nodes = {nodes}
[data]
train_files = ["{SPECS / "data" / "tiny-corpus.txt"}"]
seq_len = 2048
[training]
effective_batch_size = 128
max_steps = 1000
[output]
dir = "{shared / "runs" / "llama"}"
[launch]
storage = "{shared}"
{launch}
""")
    return path


def in_process(capsys: Any, *args: Any) -> tuple[int, str, str]:
    """`gpuplan ARGS` run in this process (the hand-off is torch-free): exit code, stdout, stderr."""
    from gpuplan.cli.main import main

    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err
