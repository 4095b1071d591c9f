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

Submitted with `ray job submit --no-wait -- python ray_job.py` (the Ray Jobs CLI of the Ray installed beside
gpuplan), and `ray job status` answers `gpuplan show`. The job client reaches the cluster through its head's
dashboard: launch.ray_dashboard_address, else launch.ray_address (the client asks that GCS for the dashboard's
address), else RAY_API_SERVER_ADDRESS / RAY_ADDRESS or a cluster on this machine, as the client finds one; the
address used is recorded with the job id for `gpuplan show`. Ray's side needs `ray[default]` (the dashboard and
its job server) on the head.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from gpuplan.clusters.engine import Engine, RemoteStatus, SubmitError
from gpuplan.clusters.job import Job
from gpuplan.lifecycle.run_lock import JOB_ID_ENV
from gpuplan.plan.resolved import LaunchSettings

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


# what `ray job submit` / `ray job status` print (ray/dashboard/modules/job/cli.py: submit, _log_job_status)
_SUBMITTED = re.compile(r"Job '([^']+)' submitted successfully")
_TERMINAL = {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}  # JobStatus.is_terminal()
_OTHER = re.compile(r"Status for job '[^']+': (\w+)")
_MESSAGE = re.compile(r"Status message: (.*)")
# Ray's client lets these override --address (ray/dashboard/utils.py get_address_for_submission_client)
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_RAY_JOB = "from ray.dashboard.modules.job.cli import job_cli_group; job_cli_group(prog_name='ray job')"
_UNREACHABLE = (
    "Failed to connect to Ray",  # no dashboard answers at an http address
    "Timed out while waiting for GCS",  # no GCS answers at a GCS address
    "Couldn't obtain the API server address",  # the GCS knows no dashboard (started with --include-dashboard=false)
    "Could not find any running Ray instance",  # no address at all, and no cluster on this machine
)


def client_address(launch: LaunchSettings) -> tuple[str, str] | None:
    """(the [launch] key, its value) that tells Ray's job client where the cluster is: the dashboard's
    http address, else the GCS address (the client asks the GCS for the dashboard's); None: the client's
    own default (RAY_API_SERVER_ADDRESS, RAY_ADDRESS, or a cluster started on this machine)."""
    if launch.ray_dashboard_address:
        return "launch.ray_dashboard_address", launch.ray_dashboard_address
    if launch.ray_address and launch.ray_address != "auto":
        return "launch.ray_address", launch.ray_address
    return None


def ray_job_command(command: str, args: list[str], address: str | None) -> tuple[list[str], dict[str, str]]:
    """argv and environment of `ray job COMMAND ARGS` for the cluster at `address` (None: the client's default).

    The client is `ray job` of the Ray this gpuplan imports, so it is found without `ray` on PATH and is the
    version missing_client checked: the click group that `ray`'s console script adds as `job`
    (ray/scripts/scripts.py), called without the rest of Ray's CLI, whose imports cost about 2.5 s more
    a call. An address the spec names wins over the environment's."""
    # plain record-style lines: what job_status reads (cli_logger's "auto" colours them even off a terminal)
    argv = [sys.executable, "-c", _RAY_JOB, command, "--log-style", "record", "--log-color", "false"]
    env = dict(os.environ)
    if address is not None:
        argv += ["--address", address]
        for name in ADDRESS_ENV:
            env.pop(name, None)
    return argv + args, env


def _last_line(text: str) -> str | None:
    """The client's own last words (the exception's line, after Ray's traceback)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def job_status(text: str, job_id: str, source: str) -> RemoteStatus:
    """`ray job status JOB_ID`'s output as a RemoteStatus: one of _log_job_status's four forms."""
    message = _MESSAGE.search(text)
    detail = message.group(1).strip() if message else None
    for words, state in _TERMINAL.items():
        if f"Job '{job_id}' {words}" in text:
            return RemoteStatus(state=state, done=True, source=source, detail=detail)
    if (m := _OTHER.search(text)) is not None:
        return RemoteStatus(state=m.group(1), done=False, source=source, detail=detail)
    return RemoteStatus(state="unknown", done=None, source=source, detail=_last_line(text))


class RayEngine(Engine):
    target = "ray"
    client = "ray job submit (Ray's job client: pip install 'ray[default]', or gpuplan's `cluster-ray` extra)"

    def render(self, job: Job) -> dict[str, str]:
        return {SCRIPT_FILE: script(job)}

    def missing_client(self) -> str | None:
        # the job client needs ray[default]'s aiohttp besides ray (ray/dashboard/modules/job/sdk.py refuses without it)
        if importlib.util.find_spec("ray") is None or importlib.util.find_spec("aiohttp") is None:
            return "Ray's job client is not installed here (pip install 'ray[default]', or pip install 'gpuplan[cluster-ray]')"
        return None

    def address(self, launch: LaunchSettings) -> str | None:
        named = client_address(launch)
        return named[1] if named else None

    def submit(self, job: Job, files: Mapping[str, Path]) -> str:
        named = client_address(job.launch)
        argv, env = ray_job_command("submit", ["--no-wait", "--", "python", str(files[SCRIPT_FILE])], named[1] if named else None)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        said = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            if any(words in said for words in _UNREACHABLE):
                raise unreachable(named, _last_line(said))
            raise SubmitError(f"ray job submit failed (exit {proc.returncode})", detail=_last_line(said))
        m = _SUBMITTED.search(said)
        if m is None:
            raise SubmitError("ray job submit printed no job id", detail=said or None)
        return m.group(1)

    def status(self, job_id: str, address: str | None = None) -> RemoteStatus:
        argv, env = ray_job_command("status", [job_id], address)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        text = (proc.stdout + proc.stderr).strip()
        source = "ray job status"
        if proc.returncode != 0:
            state = "not found" if f"Job {job_id} does not exist" in text else "unknown"
            return RemoteStatus(state=state, done=None, source=source, detail=_last_line(text))
        return job_status(text, job_id, source)


def unreachable(named: tuple[str, str] | None, said: str | None) -> SubmitError:
    """The job client reached no Ray dashboard: the key (or variable) that named the address and what to do."""
    fix = (
        'set launch.ray_dashboard_address to the head\'s dashboard as this machine reaches it ("http://HEAD:8265"), and check '
        "that the head runs it (`ray start --head --dashboard-host 0.0.0.0`, with ray[default] installed there)"
    )
    if named is None:
        env = [f"{name} = {os.environ[name]!r}" for name in ADDRESS_ENV if os.environ.get(name)]
        where = f"at {env[0]} (the environment's; no [launch] key names a cluster)" if env else "(no [launch] key names one)"
        return SubmitError(
            f"ray job submit could not reach a Ray cluster {where}", key="launch.ray_dashboard_address", detail=said, fix=fix
        )
    key, value = named
    return SubmitError(f"ray job submit could not reach the Ray cluster at {key} = {value!r}", key=key, detail=said, fix=fix)


ENGINE = RayEngine()
