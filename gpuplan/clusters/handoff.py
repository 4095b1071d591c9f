"""`gpuplan apply` of a plan whose [launch] names a cluster: write the job, submit it, record it.

1. the Job (job.py) and its engine (engine.py); a missing client is refused before anything is written,
   naming the binary or package and the dry run that needs none;
2. the job dir, output.dir/gpuplan-job/: the saved plan (its spec_path naming the spec's copy beside it,
   so the job's `gpuplan apply` checks the plan against the spec it was made from), the spec, its lock
   file when it has one, and the engine's rendered files; a SkyPilot job's other GPU types each add
   their own plan, plan.<GPU>.json, which a node with that GPU applies (cli/apply.py load_target);
3. --dry-run stops there; otherwise the engine's client submits and the job id goes into
   gpuplan-state.json (lifecycle/state.py record_submission), which `gpuplan show` reads back
   and asks the engine about (remote_status).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuplan.clusters.engine import RemoteStatus, engine_for
from gpuplan.clusters.job import IN_JOB_FLAG, Job, JobError, job_for, plan_for_gpu
from gpuplan.errors import GpuplanError, OneProblem
from gpuplan.plan.types import Plan


class ClientMissing(OneProblem):
    """The engine's client is not installed here (exit 1, nothing written)."""


def job_files(plan: Plan, job: Job, rendered: Mapping[str, str]) -> dict[str, Path]:
    """Write the job dir (the saved plan, the spec and its lock file, the rendered job); {name: path}."""
    from gpuplan.fsutil import write_text_atomic
    from gpuplan.hub.lockfile import lock_path

    root = Path(job.job_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        written: dict[str, Path] = {}
        spec_copy = None
        if plan.spec_path and os.path.isfile(plan.spec_path):
            spec_copy = root / Path(plan.spec_path).name
            shutil.copyfile(plan.spec_path, spec_copy)
            written[spec_copy.name] = spec_copy
            lock = lock_path(plan.spec_path)
            if lock.is_file():
                shutil.copyfile(lock, root / lock.name)
                written[lock.name] = root / lock.name
        saved = dataclasses.replace(plan, spec_path=str(spec_copy) if spec_copy else plan.spec_path)
        write_text_atomic(job.plan_file, json.dumps(saved.to_dict(), indent=2, sort_keys=True) + "\n")
        written[Path(job.plan_file).name] = Path(job.plan_file)
        for gpu, other in job.gpu_plans.items():  # a SkyPilot job's other GPU types: the plan a node with that GPU applies
            path = Path(plan_for_gpu(job.plan_file, gpu))
            other = dataclasses.replace(other, spec_path=saved.spec_path)
            write_text_atomic(path, json.dumps(other.to_dict(), indent=2, sort_keys=True) + "\n")
            written[path.name] = path
        for name, text in rendered.items():
            write_text_atomic(root / name, text)
            written[name] = root / name
    except OSError as e:
        raise JobError(
            f"cannot write the job's files into {root}: {e.strerror or e}",
            key="output.dir",
            fix="set output.dir to a writable folder on the shared storage (launch.storage), mounted here as on the nodes",
        ) from None
    return written


def hand_off(
    plan: Plan,
    *,
    target: str,
    dry_run: bool,
    confirm: Callable[[], None],
    echo: Callable[[str], None] = print,
) -> int:
    """Render, write, and (unless dry_run) submit the plan's job; the exit code."""
    from gpuplan.lifecycle.state import record_submission

    job = job_for(plan)
    engine = engine_for(job.target)
    if not dry_run and (missing := engine.missing_client()) is not None:
        raise ClientMissing(
            f"launch.target = {job.target!r}: {missing}",
            key="launch.target",
            fix=f"install it, or write the job without submitting it: gpuplan apply {target} --dry-run",
        )
    echo("\n".join(job.lines()))
    if not dry_run:
        confirm()  # before anything is written: a refused apply leaves nothing behind
    files = job_files(plan, job, engine.render(job))
    if dry_run:
        echo(f"Wrote the {job.target} job without submitting it: " + ", ".join(str(p) for p in files.values()))
        return 0
    job_id = engine.submit(job, files)
    record = {
        "target": job.target,
        "id": job_id,
        "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "job_dir": job.job_dir,
        "files": sorted(files),
        "command": list(job.command),
        "time_limit_s": job.time_limit.seconds,
    }
    if (address := engine.address(job.launch)) is not None:
        record["address"] = address  # where `gpuplan show` asks about the job (Ray's dashboard or GCS address)
    record_submission(plan, job.output_dir, record)
    echo(f"Submitted {job.target} job {job_id}; follow it with: gpuplan show {job.output_dir}")
    return 0


def remote_status(state: Mapping[str, Any]) -> dict[str, Any] | None:
    """{target, id, state, done, source, detail} of a state's submitted job as its engine reports it now;
    None for a run started here. A missing client is reported, not raised (show still shows the state)."""
    job = state.get("job")
    if not isinstance(job, dict) or "target" not in job or "id" not in job:
        return None
    try:
        engine = engine_for(str(job["target"]))
    except GpuplanError as e:
        return {"target": job["target"], "id": job["id"], **RemoteStatus("unknown", None, "none", e.summary).to_dict()}
    if (missing := engine.missing_client()) is not None:
        status = RemoteStatus(state="unknown", done=None, source="none", detail=missing)
    else:
        status = engine.status(str(job["id"]), str(job["address"]) if job.get("address") else None)
    return {"target": job["target"], "id": job["id"], **status.to_dict()}


__all__ = ["IN_JOB_FLAG", "ClientMissing", "hand_off", "job_files", "remote_status"]
