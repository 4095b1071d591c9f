"""SkyPilot: a task YAML run as a managed job, and the planned run time handed to SkyPilot's optimizer.

The task (SkyPilot 0.14 task YAML, sky/utils/schemas.py get_task_schema):
- `num_nodes` = hardware.nodes; `resources.accelerators` = the GPU types the job may run on
  (clusters/accelerators.py: every catalog GPU that fits, as compare finds them), each with the plan's GPUs per node, in SkyPilot's names;
  `cpus` / `memory` as "N+" minimums from the plan; `image_id: docker:<launch.image>`;
  `use_spot` = launch.spot; `job_recovery` FAILOVER with restarts on errors, so a preempted or failed
  managed job is relaunched (sky/jobs/recovery_strategy.py) and gpuplan resumes it from the last checkpoint.
- `file_mounts`: launch.storage_bucket mounted at launch.storage on every node, in MOUNT_CACHED mode
  (sky/utils/schemas.py get_storage_schema: source, mode; gpuplan/spec/buckets.py says why that mode),
  so a relaunched VM and the other nodes find the saved plan, the state and the checkpoints there;
  none where launch.storage_shared says the image or the cloud already shares it.
- `run`: each node runs `gpuplan apply` of the saved plan with --node-rank $SKYPILOT_NODE_RANK; the
  rendezvous host is the first line of $SKYPILOT_NODE_IPS (node 0); the run refuses a node whose
  $SKYPILOT_NUM_GPUS_PER_NODE is not the plan's (SkyPilot docs, "Distributed Multi-Node Jobs":
  the environment variables every node gets).

The time: a task YAML has no field for it, and SkyPilot's optimizer prices a task without a time
estimator at one hour ("Defaulting the task's estimated time to 1 hour", sky/optimizer.py
_estimate_nodes_cost_or_time), so its cost column is $/hour. `Task.set_time_estimator` takes a
callable from a Resources to seconds (sky/task.py), which no YAML can carry and the API server never
sees (the client sends the DAG as YAML: sky/client/sdk.py optimize). So submit() loads the rendered
YAML with SkyPilot's own `Task.from_yaml`, sets the estimator to the planned run time of each
accelerator, runs SkyPilot's optimizer here (its catalogs and the clouds `sky check` enabled), keeps
the accelerator type whose *total* cost is lowest (the cloud and region are left to the jobs
controller: for one accelerator type the same run time ranks them as its hourly price does), and
launches that as the managed job.
"""

from __future__ import annotations

import importlib.util
import math
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuplan.clusters.accelerators import SKYPILOT_ACCELERATORS
from gpuplan.clusters.engine import Engine, RemoteStatus, SubmitError
from gpuplan.clusters.job import Job, JobError
from gpuplan.clusters.yaml_text import dump
from gpuplan.lifecycle.run_lock import JOB_ID_ENV

TASK_FILE = "sky-task.yaml"
RESTARTS_ON_ERRORS = 3


def accelerators(job: Job) -> dict[str, int]:
    """{SkyPilot accelerator name: GPUs per node} for every GPU type the job may run on; {} for a CPU plan."""
    r = job.resources
    if not r.gpus_per_node:
        return {}
    out = {}
    for gpu in r.accelerators or (r.gpu,):
        name = SKYPILOT_ACCELERATORS.get(gpu)
        if name is None:
            known = ", ".join(sorted(SKYPILOT_ACCELERATORS))
            raise JobError(
                f"hardware.gpu = {gpu!r} has no SkyPilot accelerator name gpuplan knows (SkyPilot's catalogs do not tell it apart)",
                key="hardware.gpu",
                fix=f"plan for one of {known}",
            )
        out[name] = r.gpus_per_node
    return out


def run_script(job: Job) -> str:
    """What every node runs: the GPUs SkyPilot gave checked, node 0's IP as the rendezvous host, the saved plan applied."""
    gpus = job.resources.gpus_per_node
    command = shlex.join(job.command)
    lines = ["set -e"]
    if gpus:
        lines += [
            f'if [ "$SKYPILOT_NUM_GPUS_PER_NODE" != "{gpus}" ]; then',
            f'  echo "gpuplan: the plan needs {gpus} GPUs per node, SkyPilot gave $SKYPILOT_NUM_GPUS_PER_NODE" >&2; exit 1',
            "fi",
        ]
    lines += [
        'export MASTER_ADDR="$(echo "$SKYPILOT_NODE_IPS" | head -n1)"',
        f'exec {command} --node-rank "$SKYPILOT_NODE_RANK"',
    ]
    return "\n".join(lines) + "\n"


def task_config(job: Job) -> dict[str, Any]:
    """The task as SkyPilot's YAML holds it."""
    if not job.launch.image:
        raise JobError('launch.target = "skypilot" needs launch.image', key="launch.image", fix='set launch.image = "registry/name:tag"')
    r = job.resources
    resources: dict[str, Any] = {}
    acc = accelerators(job)
    if acc:
        resources["accelerators"] = acc if len(acc) > 1 else f"{next(iter(acc))}:{next(iter(acc.values()))}"
    resources["cpus"] = f"{r.cpus_per_node}+"
    if r.memory_gib_per_node:
        resources["memory"] = f"{math.ceil(r.memory_gib_per_node)}+"
    resources["image_id"] = f"docker:{job.launch.image}"
    resources["use_spot"] = bool(job.launch.spot)
    resources["job_recovery"] = {"strategy": "FAILOVER", "max_restarts_on_errors": RESTARTS_ON_ERRORS}
    return {
        "name": job.name,
        "num_nodes": job.nodes,
        "resources": resources,
        **({"file_mounts": file_mounts(job)} if job.storage_mount() else {}),
        "envs": {**job.env, JOB_ID_ENV: f"skypilot:{job.name}", "MASTER_PORT": str(job.master_port)},
        "run": run_script(job),
    }


def file_mounts(job: Job) -> dict[str, dict[str, str]]:
    """{launch.storage: the bucket, mounted with write-back} (SkyPilot's "Cloud Buckets" file_mounts entry)."""
    mount = job.storage_mount()
    assert mount is not None
    return {mount["path"]: {"source": mount["source"], "mode": mount["mode"]}}


def planned_seconds(job: Job) -> dict[str, float]:
    """{SkyPilot accelerator name: the planned run time in seconds}: the plan's own for its GPU, and the
    per-GPU run times the job carries for the others (job.planned["run_time_s_by_gpu"], from compare)."""
    by_gpu = dict(job.planned.get("run_time_s_by_gpu") or {})
    run = job.planned.get("run_time_s")
    if run is not None:
        by_gpu.setdefault(job.resources.gpu, run)
    return {SKYPILOT_ACCELERATORS[g]: float(s) for g, s in by_gpu.items() if g in SKYPILOT_ACCELERATORS and s is not None}


def default_seconds(job: Job) -> float:
    """The time of an accelerator the plan has no run time for: the plan's own run time, else the time limit."""
    return float(job.time_limit.planned_run_s or job.time_limit.seconds)


def time_estimator(seconds: Mapping[str, float], default_s: float) -> Callable[[Any], int]:
    """Task.set_time_estimator's callable: a sky.Resources -> the planned seconds of its accelerator."""

    def estimate(resources: Any) -> int:
        names = list((resources.accelerators or {}).keys())
        return int(round(seconds.get(names[0], default_s) if names else default_s))

    return estimate


def load_task(path: str | Path, seconds: Mapping[str, float], default_s: float) -> Any:
    """The rendered YAML read by SkyPilot itself, with the planned run times as its time estimator."""
    import sky

    task = sky.Task.from_yaml(str(path))
    task.set_time_estimator(time_estimator(seconds, default_s))
    return task


def optimize(task: Any, quiet: bool = False) -> Any:
    """SkyPilot's optimizer over the task here, minimising cost = hourly price x the planned time x nodes; the chosen Resources."""
    import sky
    from sky.utils import common

    dag = sky.Dag()
    dag.add(task)
    sky.Optimizer.optimize(dag, minimize=common.OptimizeTarget.COST, quiet=quiet)
    return task.best_resources


def narrowed(task: Any, best: Any) -> Any:
    """The task kept to the optimizer's accelerator type (clouds and regions still open to the controller)."""
    chosen = dict(best.accelerators or {})
    keep = {r for r in task.resources if dict(r.accelerators or {}) == chosen}
    if keep:
        task.set_resources(keep)
    return task


class SkyPilotEngine(Engine):
    target = "skypilot"
    client = "skypilot (pip install skypilot, or gpuplan's `cluster-skypilot` extra)"

    def render(self, job: Job) -> dict[str, str]:
        return {TASK_FILE: dump(task_config(job))}

    def missing_client(self) -> str | None:
        if importlib.util.find_spec("sky") is None:
            return "SkyPilot's Python client is not installed (pip install skypilot, or pip install 'gpuplan[cluster-skypilot]')"
        return None

    def submit(self, job: Job, files: Mapping[str, Path]) -> str:
        import sky

        task = load_task(files[TASK_FILE], planned_seconds(job), default_seconds(job))
        try:  # SkyPilot's table, its cost column the run's total; several accelerator types: keep the cheapest run's
            task = narrowed(task, optimize(task))
        except Exception as e:  # no cloud enabled here (a remote API server): the controller ranks by the hour
            print(f"SkyPilot's optimizer did not run here ({type(e).__name__}: {e}); the jobs controller chooses by $/hour")
        try:
            job_ids, _ = sky.stream_and_get(sky.jobs.launch(task, name=job.name))
        except Exception as e:  # SkyPilot's own error, in its words
            raise SubmitError(f"sky jobs launch {job.name} failed", detail=f"{type(e).__name__}: {e}") from None
        if not job_ids:
            raise SubmitError(f"sky jobs launch {job.name} returned no job id")
        return str(job_ids[0])

    def status(self, job_id: str, address: str | None = None) -> RemoteStatus:
        import sky

        source = "sky jobs queue"
        try:
            records = sky.stream_and_get(sky.jobs.queue(refresh=False, job_ids=[int(job_id)]))
        except Exception as e:  # the client's error becomes the status' detail
            return RemoteStatus(state="unknown", done=None, source=source, detail=f"{type(e).__name__}: {e}")
        return managed_job_status(records, job_id, source)


def managed_job_status(records: Any, job_id: str, source: str) -> RemoteStatus:
    """The managed job `job_id` among `sky jobs queue`'s records (dicts, or ManagedJobRecord models:
    sky/schemas/api/responses.py), its status a ManagedJobStatus (sky/jobs/state.py) or its name."""
    for rec in records or ():
        row = rec if isinstance(rec, Mapping) else rec.model_dump()
        if str(row.get("job_id")) != job_id:
            continue
        status = row.get("status")
        if status is None:
            return RemoteStatus(state="unknown", done=None, source=source)
        from sky.jobs.state import ManagedJobStatus

        status = status if isinstance(status, ManagedJobStatus) else ManagedJobStatus(str(status))
        reason = row.get("failure_reason")
        return RemoteStatus(state=status.value, done=status.is_terminal(), source=source, detail=str(reason) if reason else None)
    return RemoteStatus(state="not found", done=None, source=source)


ENGINE = SkyPilotEngine()
