"""Ray: a Ray Train TorchTrainer script whose workers are the plan's nodes, each running `gpuplan apply`.

One Ray Train worker per node (ScalingConfig(num_workers = hardware.nodes)), holding the node's share
of the plan: resources_per_worker = {"GPU": hardware.count, "CPU": the plan's cores per node}, so Ray
places one worker on each GPU node. Each worker runs `gpuplan apply` of the saved plan with its world
rank as the node rank, which starts torchrun for the node's processes (apply/launch/torchrun.py),
so the run lock, the resume point, the drift check and the audit work as under any launcher.
The rendezvous host is rank 0's node IP, sent to every worker with
`ray.train.collective.broadcast_from_rank_zero` (ray 2.60, ray/train/collective/collectives.py).

Ray's torch backend sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in each worker for
its own process group (ray/train/torch/config.py): the script removes them from `gpuplan apply`'s
environment, which would otherwise take the worker for a torchrun rank. RunConfig stores Ray's results
in the job dir (on the shared storage) and FailureConfig(max_failures) restarts the worker group after a
lost node; gpuplan resumes from the last checkpoint, taking over its own run lock (GPUPLAN_JOB_ID).

Submitted with `ray job submit --no-wait -- python ray_job.py` (Ray Jobs CLI; RAY_ADDRESS names the
cluster's dashboard); `ray job status` answers `gpuplan show`.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpuplan.clusters.engine import Engine, RemoteStatus, SubmitError
from gpuplan.clusters.job import Job
from gpuplan.lifecycle.run_lock import JOB_ID_ENV

SCRIPT_FILE = "ray_job.py"
MAX_FAILURES = 3
# set by Ray's torch backend in every worker (ray/train/torch/config.py _set_torch_distributed_env_vars)
RAY_TORCH_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ACCELERATE_TORCH_DEVICE",
)

_SCRIPT = '''"""Ray Train job rendered by gpuplan (gpuplan/clusters/ray.py) for the saved plan {plan_file}.

Run it where `ray.init` reaches the cluster: `ray job submit -- python {script}`, or `python {script}` on a node.
"""

import os
import subprocess

import ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.collective import broadcast_from_rank_zero
from ray.train.torch import TorchTrainer

COMMAND = {command!r}  # `gpuplan apply` of the saved plan; each worker adds --node-rank
ENV = {env!r}
RAY_TORCH_ENV = {ray_env!r}  # Ray's process-group variables: not gpuplan's


def train_loop_per_worker(config):
    rank = ray.train.get_context().get_world_rank()
    head = broadcast_from_rank_zero(ray.util.get_node_ip_address())
    env = {{k: v for k, v in os.environ.items() if k not in RAY_TORCH_ENV}}
    env.update(ENV, MASTER_ADDR=head)
    done = subprocess.run([*COMMAND, "--node-rank", str(rank)], env=env)
    if done.returncode != 0:
        raise RuntimeError(f"gpuplan apply on node {{rank}} exited with {{done.returncode}}")


def main():
    ray.init(address={address!r})
    trainer = TorchTrainer(
        train_loop_per_worker,
        scaling_config=ScalingConfig(num_workers={nodes}, use_gpu={use_gpu}, resources_per_worker={resources!r}),
        run_config=RunConfig(name={name!r}, storage_path={storage_path!r}, failure_config=FailureConfig(max_failures={max_failures})),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error


if __name__ == "__main__":
    main()
'''


def resources_per_worker(job: Job) -> dict[str, float]:
    r = job.resources
    out: dict[str, float] = {"CPU": float(r.cpus_per_node)}
    if r.gpus_per_node:
        out["GPU"] = float(r.gpus_per_node)
    return out


def script(job: Job) -> str:
    """The TorchTrainer script: the plan's nodes as workers, each running the saved plan."""
    return _SCRIPT.format(
        plan_file=job.plan_file,
        script=SCRIPT_FILE,
        command=list(job.command),
        env={**job.env, JOB_ID_ENV: f"ray:{job.name}", "MASTER_PORT": str(job.master_port)},
        ray_env=RAY_TORCH_ENV,
        address=job.launch.ray_address or "auto",
        nodes=job.nodes,
        use_gpu=bool(job.resources.gpus_per_node),
        resources=resources_per_worker(job),
        name=job.name,
        storage_path=str(Path(job.job_dir) / "ray"),
        max_failures=MAX_FAILURES,
    )


_SUBMITTED = re.compile(r"Job '([^']+)' submitted successfully")


class RayEngine(Engine):
    target = "ray"
    client = "ray (pip install 'ray[train]', or gpuplan's `cluster-ray` extra)"

    def render(self, job: Job) -> dict[str, str]:
        return {SCRIPT_FILE: script(job)}

    def missing_client(self) -> str | None:
        if importlib.util.find_spec("ray") is None or shutil.which("ray") is None:
            return "Ray is not installed here (pip install 'ray[train]', or pip install 'gpuplan[cluster-ray]')"
        return None

    def submit(self, job: Job, files: Mapping[str, Path]) -> str:
        argv = ["ray", "job", "submit", "--no-wait", "--", "python", str(files[SCRIPT_FILE])]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SubmitError(f"ray job submit failed (exit {proc.returncode})", detail=(proc.stderr or proc.stdout).strip() or None)
        m = _SUBMITTED.search(proc.stdout + proc.stderr)
        if m is None:
            raise SubmitError("ray job submit printed no job id", detail=(proc.stdout + proc.stderr).strip() or None)
        return m.group(1)

    def status(self, job_id: str) -> RemoteStatus:
        proc = subprocess.run(["ray", "job", "status", job_id], capture_output=True, text=True)
        source = "ray job status"
        text = (proc.stdout + proc.stderr).strip()
        m = re.search(r"Status for job '[^']+': (\w+)", text)
        if proc.returncode != 0 or m is None:
            return RemoteStatus(state="unknown", done=None, source=source, detail=text or None)
        state = m.group(1)
        return RemoteStatus(state=state, done=state in {"SUCCEEDED", "FAILED", "STOPPED"}, source=source)


ENGINE = RayEngine()
