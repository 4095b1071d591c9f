"""The job a plan becomes on a cluster: resources, nodes x GPUs, the time limit, the command, storage.

Built from the Plan alone (torch-free), and read by every engine's renderer (gpuplan/clusters/slurm.py,
kubernetes.py, skypilot.py, ray.py), so the engines agree on what they ask the cluster for:

- nodes x GPUs per node are the plan's hardware.nodes x hardware.count; each node runs one task,
  `gpuplan apply` of the saved plan, which starts torchrun for the node's ranks (apply/launch/torchrun.py);
- the time limit is the high end of the plan's run-time range (plan/estimate/interval.py), times
  (1 + launch.time_margin), plus launch.startup_minutes for loading and the final save, rounded up to
  whole minutes; launch.time_limit_minutes replaces it and is refused when shorter than the planned run;
- the command is `gpuplan apply JOB_DIR/plan.json --yes --in-job`: the same saved plan, whose lock file
  pins the models and data, so drift, resume and the audit work there as here;
- SkyPilot's job lists every catalog GPU type that fits the spec at the plan's nodes x GPUs, cheapest
  run first as `gpuplan compare` ranks them, each with its own plan and run time (clusters/accelerators.py);
  the other engines run on the plan's GPU;
- output.dir is under launch.storage, the shared file system every node mounts at the same path:
  the checkpoints, gpuplan-state.json, the run lock and the job dir (the saved plan, the spec, its lock
  file and the rendered job) live there. Several nodes without it are refused.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuplan.clusters.accelerators import Choice, fitting_accelerators
from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.plan.resolved import LaunchSettings
from gpuplan.plan.types import Plan
from gpuplan.spec.buckets import MOUNT_MODE
from gpuplan.units import GIB

JOB_DIR = "gpuplan-job"  # inside output.dir
PLAN_FILE = "plan.json"  # inside the job dir
IN_JOB_FLAG = "--in-job"  # `gpuplan apply ... --in-job`: train here, do not hand off again


class JobError(GpuplanError):
    """The plan cannot be handed off as it is: key, value, fix (exit 1, nothing written)."""

    def __init__(self, summary: str, *, key: str, fix: str, detail: str | None = None):
        super().__init__([Diagnostic("error", key, summary, detail, fix)])


@dataclass(frozen=True)
class TimeLimit:
    """The job's wall-clock limit and where it comes from."""

    seconds: int  # whole minutes, as every engine takes them
    planned_run_s: float | None  # the plan's run time (central estimate)
    planned_high_s: float | None  # the high end of its range (the central one where the plan has no range)
    margin: float  # launch.time_margin
    startup_s: int  # launch.startup_minutes, in seconds
    source: Literal["planned", "user"]  # derived from the plan, or launch.time_limit_minutes

    @property
    def minutes(self) -> int:
        return self.seconds // 60

    def hms(self) -> str:
        """Slurm's --time form: "D-HH:MM:SS", or "HH:MM:SS" under a day (sbatch(1), --time)."""
        days, rest = divmod(self.seconds, 86400)
        h, rest = divmod(rest, 3600)
        m, s = divmod(rest, 60)
        return (f"{days}-" if days else "") + f"{h:02d}:{m:02d}:{s:02d}"

    def reason(self) -> str:
        if self.source == "user":
            run = f"; the planned run is ~{duration(self.planned_run_s)}" if self.planned_run_s is not None else ""
            return f"launch.time_limit_minutes = {self.minutes}{run}"
        assert self.planned_high_s is not None and self.planned_run_s is not None
        high = "" if self.planned_high_s == self.planned_run_s else f", high end {duration(self.planned_high_s)}"
        return (
            f"planned run ~{duration(self.planned_run_s)}{high} x {1 + self.margin:g} (launch.time_margin = {self.margin:g}) "
            f"+ {self.startup_s // 60} min start-up and final save (launch.startup_minutes)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "hms": self.hms(),
            "planned_run_s": self.planned_run_s,
            "planned_high_s": self.planned_high_s,
            "margin": self.margin,
            "startup_s": self.startup_s,
            "source": self.source,
            "reason": self.reason(),
        }


@dataclass(frozen=True)
class Resources:
    """What one node of the job asks for."""

    gpu: str  # the catalog name the plan is for ("H100-80GB"), or "cpu"
    gpus_per_node: int  # 0 for a CPU plan
    processes_per_node: int  # ranks per node (hardware.count), CPU ranks too
    cpus_per_node: int  # a core per rank and per dataloader worker of each rank
    memory_gib_per_node: float | None  # host RAM the plan needs per node, where the plan knows it
    accelerators: tuple[str, ...]  # GPU types the job may run on (empty for CPU): the plan's, or SkyPilot's that fit

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "gpus_per_node": self.gpus_per_node,
            "processes_per_node": self.processes_per_node,
            "cpus_per_node": self.cpus_per_node,
            "memory_gib_per_node": self.memory_gib_per_node,
            "accelerators": list(self.accelerators),
        }


@dataclass(frozen=True)
class Job:
    """One plan as a cluster job; every engine renders this and nothing else."""

    target: str  # slurm | kubernetes | skypilot | ray
    name: str  # DNS-safe: lower-case letters, digits and "-", at most 50 characters
    nodes: int
    resources: Resources
    time_limit: TimeLimit
    command: tuple[str, ...]  # what each node runs once
    env: Mapping[str, str]  # set in the job's environment (the renderer adds GPUPLAN_JOB_ID, lifecycle/run_lock.py JOB_ID_ENV)

    storage: str | None  # launch.storage
    output_dir: str
    job_dir: str  # output_dir/gpuplan-job
    plan_file: str  # job_dir/plan.json
    master_port: int
    save_steps: int  # how often a checkpoint is written: what a requeue can lose
    launch: LaunchSettings
    planned: Mapping[str, Any] = field(default_factory=dict)  # run_time_s, cost_usd, ... (SkyPilot's estimate)
    choice: Choice | None = None  # SkyPilot: the GPU types listed, each with its plan, and those left out

    @property
    def gpu_plans(self) -> dict[str, Plan]:
        """{catalog name: the plan a node with that GPU applies} for the listed GPUs other than the plan's own."""
        if self.choice is None:
            return {}
        return {a.gpu: a.plan for a in self.choice.listed if a.gpu != self.resources.gpu}

    @property
    def world_size(self) -> int:
        return self.nodes * self.resources.processes_per_node

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "name": self.name,
            "nodes": self.nodes,
            "world_size": self.world_size,
            "resources": self.resources.to_dict(),
            "time_limit": self.time_limit.to_dict(),
            "command": list(self.command),
            "env": dict(self.env),
            "storage": self.storage,
            **({"storage_mount": mount} if (mount := self.storage_mount()) else {}),
            "output_dir": self.output_dir,
            "job_dir": self.job_dir,
            "plan_file": self.plan_file,
            "master_port": self.master_port,
            "save_steps": self.save_steps,
            "planned": dict(self.planned),
            **({"accelerators": self.choice.to_dict()} if self.choice is not None else {}),
        }

    def storage_mount(self) -> dict[str, str] | None:
        """The bucket the engine mounts at launch.storage (SkyPilot's launch.storage_bucket), or None."""
        if self.target != "skypilot" or not self.storage or not self.launch.storage_bucket:
            return None
        return {"path": self.storage, "source": self.launch.storage_bucket, "mode": MOUNT_MODE}

    def lines(self) -> list[str]:
        """What `gpuplan plan` prints about the job it would submit."""
        r = self.resources
        gpus = f"{r.gpus_per_node} {r.gpu} GPU{'s' if r.gpus_per_node != 1 else ''} ({self.world_size} ranks)"
        per_node = gpus if r.gpus_per_node else f"{r.processes_per_node} CPU rank{'s' if r.processes_per_node != 1 else ''}"
        mem = f", {r.memory_gib_per_node:.0f} GiB host RAM" if r.memory_gib_per_node else ""
        out = [
            f"Job ({self.target}): {self.name}, {self.nodes} node{'s' if self.nodes != 1 else ''} x {per_node}, "
            f"{r.cpus_per_node} CPUs per node{mem}",
            f"  time limit {self.time_limit.hms()}: {self.time_limit.reason()}",
            f"  output.dir {self.output_dir}"
            + (f" on the shared storage {self.storage}" if self.storage else "")
            + f"; the job's files in {self.job_dir}",
            *storage_lines(self),
            f"  each node runs: {shlex.join(self.command)}",
            f"  preempted or requeued, it resumes from the last checkpoint (every {self.save_steps} steps, training.save_steps)",
        ]
        if self.choice is not None:
            out += choice_lines(self.choice, r.gpus_per_node, self.nodes)
        extra = target_options(self.launch)
        if extra:
            out.append(f"  {self.target}: " + ", ".join(f"{k} {v}" for k, v in extra.items()))
        return out


def storage_lines(job: Job) -> list[str]:
    """How the storage reaches the nodes, where the engine mounts it (SkyPilot's bucket)."""
    launch = job.launch
    if launch.target != "skypilot" or not job.storage:
        return []
    if mount := job.storage_mount():
        return [
            f"  storage: SkyPilot mounts {mount['source']} at {mount['path']} on every node ({mount['mode']}: "
            "checkpoints upload in the background; one a VM did not finish uploading is set aside on resume)",
            f"    the job's files are written here, into {job.job_dir}: mount the bucket at {job.storage} on this machine too "
            "(rclone mount, mount-s3, gcsfuse) so the nodes find them",
        ]
    if launch.storage_shared:
        return [f"  storage: {job.storage} is a shared file system the nodes already mount (launch.storage_shared)"]
    return [
        f"  storage: {job.storage} is on the VM's own disk: a job SkyPilot relaunches on a new VM starts from step 0 "
        "(set launch.storage_bucket to keep the checkpoints)"
    ]


def choice_lines(choice: Choice, per_node: int, nodes: int) -> list[str]:
    """The GPU types the SkyPilot job lists and why, and those left out."""
    fits = ", ".join(
        f"{a.gpu} (~{duration(a.run_time_s)}" + (f", ${a.cost_usd:,.2f})" if a.cost_usd is not None else ")") for a in choice.listed
    )
    out = [f"  accelerators: {fits}: the GPU types that fit {nodes} x {per_node}, cheapest run first (as gpuplan compare ranks them)"]
    if choice.note:
        out.append(f"    only the plan's GPU: {choice.note}")
    if choice.left_out:
        out.append(f"    left out ({len(choice.left_out)}): " + "; ".join(f"{g} {why}" for g, why in choice.left_out.items()))
    return out


def plan_for_gpu(plan_file: str, gpu: str) -> str:
    """The saved plan a node with GPU `gpu` applies: plan.<gpu>.json beside plan_file (a SkyPilot job's other GPU types)."""
    root, ext = os.path.splitext(plan_file)
    return f"{root}.{gpu}{ext}"


def target_options(launch: LaunchSettings) -> dict[str, str]:
    """The target's own [launch] keys that are set (partition, image, namespace, ...)."""
    from gpuplan.spec.schema import LAUNCH_TARGET_KEYS

    out = {}
    for key, targets in LAUNCH_TARGET_KEYS.items():
        value = getattr(launch, key)
        if launch.target in targets and value is not None and value is not False:
            out[key] = str(value) if value is not True else "yes"
    return out


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def dns_name(text: str) -> str:
    """`text` as a name every engine takes: RFC 1123 label characters, at most 50 (Kubernetes adds suffixes)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:50].strip("-")
    return name or "gpuplan"


def job_for(
    plan: Plan,
    launch: LaunchSettings | None = None,
    *,
    environment: Any = None,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> Job:
    """The job `plan` becomes on `launch.target` (default: the plan's [launch]); JobError when it cannot.
    SkyPilot's GPU types are planned with `environment` (None: this machine's), `prices` and `calibrations`
    (None: the user's files, hardware/userfiles.py), as `gpuplan compare` plans them."""
    launch = launch or plan.resolved.launch
    if not launch.remote:
        raise ValueError('job_for: launch.target = "local" has no job')
    hw = plan.resolved.hardware
    out = os.path.abspath(plan.resolved.output.dir)
    check_storage(launch, hw.nodes, out)
    fixed = plan.resolved.distributed.master_addr
    if hw.nodes > 1 and fixed:
        raise JobError(
            f"distributed.master_addr = {fixed!r} names a fixed rendezvous host, but {launch.target} chooses the job's nodes",
            key="distributed.master_addr",
            fix="remove distributed.master_addr: the job's tasks rendezvous on the first node the engine gives them",
        )
    job_dir = os.path.join(out, JOB_DIR)
    plan_file = os.path.join(job_dir, PLAN_FILE)
    t = plan.throughput
    choice = None
    res = resources(plan)
    if launch.target == "skypilot" and not plan.hardware.is_cpu:
        choice = skypilot_choice(plan, environment, prices, calibrations)
        res = dataclasses.replace(res, accelerators=tuple(a.gpu for a in choice.listed))
    command = (*shlex.split(launch.gpuplan_command), "apply", plan_file, "--yes", IN_JOB_FLAG)
    return Job(
        target=launch.target,
        name=launch.job_name or dns_name(plan.resolved.training.run_name or os.path.basename(out)),
        nodes=hw.nodes,
        resources=res,
        time_limit=time_limit(plan, launch),
        command=command,
        env={"PYTHONUNBUFFERED": "1"},  # the job's log shows each step as it happens
        storage=launch.storage,
        output_dir=out,
        job_dir=job_dir,
        plan_file=plan_file,
        master_port=plan.resolved.distributed.master_port,
        save_steps=plan.resolved.training.save_steps,
        launch=launch,
        planned={
            "run_time_s": t.run_time_s,
            "step_time_s": t.step_time_s,
            "max_steps": t.max_steps,
            "cost_usd": t.cost_usd,
            "price_per_gpu_hour": t.price_per_gpu_hour,
            **({"run_time_s_by_gpu": {a.gpu: a.run_time_s for a in choice.listed}} if choice else {}),
        },
        choice=choice,
    )


def skypilot_choice(
    plan: Plan, environment: Any, prices: Mapping[str, tuple[float, str]] | None, calibrations: Sequence[Mapping[str, Any]] | None
) -> Choice:
    """clusters/accelerators.py fitting_accelerators, with the user's prices and measured runs where none are given."""
    if prices is None or calibrations is None:
        from gpuplan.hardware.userfiles import read_calibrations, read_user_prices

        prices = read_user_prices() if prices is None else prices
        calibrations = read_calibrations() if calibrations is None else calibrations
    return fitting_accelerators(plan, environment=environment, prices=prices, calibrations=calibrations)


def check_storage(launch: LaunchSettings, nodes: int, output_dir: str) -> None:
    storage = launch.storage
    if launch.target == "skypilot" and nodes > 1 and storage is not None and not (launch.storage_bucket or launch.storage_shared):
        raise JobError(
            f"hardware.nodes = {nodes} on SkyPilot with launch.storage = {storage!r} but nothing shares it: the VMs "
            "SkyPilot provisions have no shared file system, so the other nodes, and a job relaunched after a "
            "preemption, would not see the saved plan and the checkpoints",
            key="launch.storage_bucket",
            fix='set launch.storage_bucket to a bucket SkyPilot mounts at launch.storage on every node ("s3://my-bucket"), '
            "or launch.storage_shared = true if the image or the cloud already mounts a shared file system there",
        )
    if storage is None:
        if nodes > 1:
            raise JobError(
                f"hardware.nodes = {nodes} on launch.target = {launch.target!r} but launch.storage is not set: every node "
                "reads the saved plan and resumes from the checkpoints in output.dir, so it must be on a shared file system",
                key="launch.storage",
                fix='set launch.storage to where the shared file system is mounted on every node ("/shared") and '
                'output.dir to a folder under it ("/shared/runs/NAME")',
            )
        return
    root = os.path.normpath(storage)
    if os.path.commonpath([root, output_dir]) != root:
        raise JobError(
            f"output.dir = {output_dir!r} is not under launch.storage = {storage!r}: the nodes would write "
            "checkpoints and the state where the other nodes and a requeued job cannot see them",
            key="output.dir",
            fix=f'set output.dir = "{os.path.join(root, "runs", os.path.basename(output_dir))}"',
        )


def resources(plan: Plan) -> Resources:
    hw, r = plan.hardware, plan.resolved.hardware
    workers = plan.resolved.training.dataloader_num_workers
    cpus = r.count * (1 + workers)  # one core per rank and per dataloader worker (the plan sized the workers)
    if r.cpu_count is not None:
        cpus = min(cpus, r.cpu_count)
    host = plan.memory.host_ram_needed_bytes
    gpu = "cpu" if hw.is_cpu else str(hw.name)
    return Resources(
        gpu=gpu,
        gpus_per_node=0 if hw.is_cpu else r.count,
        processes_per_node=r.count,
        cpus_per_node=cpus,
        memory_gib_per_node=None if host is None else round(host / GIB, 1),
        accelerators=() if hw.is_cpu else (gpu,),
    )


def time_limit(plan: Plan, launch: LaunchSettings) -> TimeLimit:
    t = plan.throughput
    run = t.run_time_s
    iv = (t.time_interval or {}).get("run_time_s")
    high = float(iv[1]) if iv else run
    startup = launch.startup_minutes * 60

    def limit_of(seconds: int, source: Literal["planned", "user"]) -> TimeLimit:
        return TimeLimit(seconds, planned_run_s=run, planned_high_s=high, margin=launch.time_margin, startup_s=startup, source=source)

    planned = None if high is None else int(math.ceil((high * (1 + launch.time_margin) + startup) / 60)) * 60
    if launch.time_limit_minutes is not None:
        limit = launch.time_limit_minutes * 60
        if run is not None and limit < run:
            assert planned is not None
            raise JobError(
                f"launch.time_limit_minutes = {launch.time_limit_minutes} is shorter than the planned run "
                f"(~{duration(run)}: {t.max_steps:,} steps at ~{t.step_time_s:.2f} s/step): the engine would stop the job before it ends",
                key="launch.time_limit_minutes",
                fix=f"set launch.time_limit_minutes = {planned // 60} (the planned run with its margin), or remove it to use that",
            )
        return limit_of(limit, "user")
    if planned is None:
        raise JobError(
            "the plan has no run time (training.max_steps is not set and the data's size is not known), so the job's "
            "time limit cannot be planned",
            key="launch.time_limit_minutes",
            fix="set training.max_steps, or set launch.time_limit_minutes",
        )
    return limit_of(planned, "planned")
