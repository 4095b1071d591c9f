"""Ray for real (gpuplan/clusters/ray.py): `gpuplan apply SPEC --yes` submits the rendered TorchTrainer job to a
local Ray cluster with `ray job submit`, the cluster trains it to the end, and `gpuplan show` reports it from
`ray job status`.

The plan: the tiny CPU Llama on 2 "nodes" x 1 CPU rank (DDP over gloo). A Ray head started for this module
(`ray start --head --block` with its dashboard, whose job server takes the job; its temp dir a short folder of
the test's own, its process group ended at the end) runs the job: the driver `python ray_job.py`, two Ray Train
workers, each `gpuplan apply` of the saved plan for its node rank, torchrun across the two. The run's state and
metrics are read back from output.dir; the job's log and status from the dashboard's REST API (Ray Jobs,
ray/dashboard/modules/job/job_head.py: GET /api/jobs/{id} and /api/jobs/{id}/logs). The same cluster then
runs a job that fails, for the engine's `ray job status` to read; and `gpuplan apply` against a dashboard
nobody answers at is refused with its key.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuplan.clusters.ray import ENGINE, SCRIPT_FILE, ray_job_command
from tests.helpers.apply_plans import CORPUS, REPO, read_jsonl
from tests.helpers.cli_runs import BOOT
from tests.helpers.cluster_launches import in_process
from tests.helpers.forked import SOCKET_VAR, socket_for

# `ray job submit` and the dashboard's job server need ray[default] (aiohttp, aiohttp_cors, ...)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None or importlib.util.find_spec("aiohttp_cors") is None,
    reason="Ray Jobs is not installed (pip install 'ray[default,train]')",
)
MODEL = REPO / "specs" / "models" / "tiny-llama-cpu.json"
STEPS = 4
JOB_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class RayHead:
    gcs: str  # the GCS address ray.init joins: launch.ray_address
    dashboard: str  # the dashboard's http address, where the job client sends the job: launch.ray_dashboard_address


def ray_spec(tmp_path: Path, head: RayHead, launch: str, *, name: str = "tiny", gpuplan_command: str | None = None) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[model]
config = "{MODEL}"
from_scratch = true
task = "causal-lm"

[hardware]
gpu = "cpu"
count = 1
nodes = 2

[data]
train_files = ["{CORPUS}"]
seq_len = 32

[training]
effective_batch_size = 4
per_device_train_batch_size = 2
dataloader_num_workers = 0
max_steps = {STEPS}
logging_steps = 1
save_steps = 1000
seed = 0

[distributed]
strategy = "ddp"
master_port = {free_port()}

[output]
dir = "{tmp_path / "shared" / "runs" / name}"

[launch]
target = "ray"
storage = "{tmp_path / "shared"}"
gpuplan_command = "{gpuplan_command or f"{sys.executable} -m gpuplan"}"
ray_address = "{head.gcs}"
startup_minutes = 5
{launch}
""")
    return path


def start_ray_head(temp_dir: Path, ports: dict[str, int], env: dict[str, str]) -> subprocess.Popen:
    # the `ray` command of this interpreter's Ray (what its console script runs), so the dashboard has ray[default]
    argv = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={ports['gcs']}", "--num-cpus=2",
        f"--temp-dir={temp_dir}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        f"--dashboard-port={ports['dashboard']}", f"--dashboard-agent-listen-port={ports['agent']}",
        f"--ray-client-server-port={ports['client']}", "--disable-usage-stats",
    ]  # fmt: skip
    head = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # the head is up once the GCS and the dashboard answer
        try:
            for port in (ports["gcs"], ports["dashboard"]):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return head
        except OSError:
            if head.poll() is not None:
                raise RuntimeError(f"ray start exited {head.returncode}: {head.stdout.read() if head.stdout else ''}") from None
            time.sleep(0.5)
    stop(head)
    raise RuntimeError("the Ray head did not come up in 120 s")


def stop(head: subprocess.Popen) -> None:
    """End the head and everything it started (its own session): GCS, raylet, dashboard, workers.

    SIGTERM goes to the head alone, which stops the processes it started (the head's env turns off its
    drain: RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S = 0). Sent to the whole group, the GCS died first; and with
    the drain on, the head waited out its 30 s drain timeout for a node that had finished its job
    (ray/_private/node.py _drain_node_before_shutdown). Whatever is left is killed."""
    try:
        os.kill(head.pid, signal.SIGTERM)
        head.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory) -> Iterator[RayHead]:
    ports = {name: free_port() for name in ("gcs", "dashboard", "agent", "client")}  # none of Ray's fixed defaults
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS")}
    env |= {"PYTHONPATH": f"{REPO}{os.pathsep}{BOOT}", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    # the job's entrypoint, `python ray_job.py`, is this interpreter (Ray runs it from the driver's PATH)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # a cluster of the test's own without token authentication, whatever ~/.ray/auth_token the user has (ray 2.60 reads it)
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # stop() ends a node that has finished: nothing to drain
    tmp = tmp_path_factory.mktemp("ray-job-tmp")
    env["TMPDIR"] = str(tmp)  # what the workers' commands put there (torchrun's torchelastic_* folders) is the test's
    # Ray's session sockets live under its temp dir, and an AF_UNIX path holds at most 107 bytes
    # (ray/_private/utils.py validate_socket_filepath): a short folder of the test's own, not one under tmp_path
    ray_temp = tempfile.mkdtemp(prefix="ray-")
    # each Ray worker's `gpuplan apply`, its torchrun agent and ranks are forked from this test worker's
    # pre-imported server through the boot shim (tests/helpers/forked.py socket_for); fresh ones where it cannot.
    # The server imports while the head starts: the head's environment names a link that points at the server's
    # socket once it is ready (the shim starts a command fresh where the link leads nowhere)
    link = os.path.join(ray_temp, "fork.sock")
    env_for_server = dict(env)
    env[SOCKET_VAR] = link
    try:
        with ThreadPoolExecutor(1) as pool:
            serving = pool.submit(socket_for, env_for_server)
            head = start_ray_head(Path(ray_temp), ports, env)
            served = serving.result()
        try:
            if served is not None:
                os.symlink(served, link)
            yield RayHead(gcs=f"127.0.0.1:{ports['gcs']}", dashboard=f"http://127.0.0.1:{ports['dashboard']}")
        finally:
            stop(head)
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)


@pytest.fixture
def job_client_env(monkeypatch):
    """The environment `gpuplan apply` and `gpuplan show` run Ray's job client in: no token authentication (the
    test's cluster has none) and no usage report. RAY_ADDRESS and RAY_API_SERVER_ADDRESS name a port nobody
    answers at, as a user's shell may name another cluster: the address the spec names must win over them."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{free_port()}")


def rest(head: RayHead, path: str) -> dict:
    with urllib.request.urlopen(head.dashboard + path, timeout=10) as r:
        return json.loads(r.read())


def wait_for_job(head: RayHead, job_id: str, timeout: float = JOB_TIMEOUT_S) -> tuple[str, str]:
    """(the job's final status, its log): polled from the dashboard until it is SUCCEEDED, FAILED or STOPPED."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = rest(head, f"/api/jobs/{job_id}")["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status, rest(head, f"/api/jobs/{job_id}/logs")["logs"]
        time.sleep(0.5)
    log = rest(head, f"/api/jobs/{job_id}/logs")["logs"]
    raise AssertionError(f"the Ray job {job_id} was still {status} after {timeout:.0f} s; its log ends:\n{log[-6000:]}")


def submitted(capsys, spec: Path, out: Path) -> str:
    """`gpuplan apply SPEC --yes` in this process: the Ray job id it recorded."""
    code, said, err = in_process(capsys, "apply", spec, "--yes")
    assert code == 0, err
    state = json.loads((out / "gpuplan-state.json").read_text())
    job_id = state["job"]["id"]
    assert state["status"] == "submitted" and state["job"]["target"] == "ray" and job_id.startswith("raysubmit_")
    assert f"Submitted ray job {job_id}; follow it with: gpuplan show {out}" in said
    return job_id


@pytest.mark.slow
def test_gpuplan_apply_submits_the_job_to_a_ray_cluster_which_trains_it_to_the_end(ray_head, job_client_env, tmp_path, capsys):
    spec = ray_spec(tmp_path, ray_head, f'ray_dashboard_address = "{ray_head.dashboard}"')
    out = tmp_path / "shared" / "runs" / "tiny"
    job_id = submitted(capsys, spec, out)
    assert json.loads((out / "gpuplan-state.json").read_text())["job"]["address"] == ray_head.dashboard  # where show asks
    text = (out / "gpuplan-job" / SCRIPT_FILE).read_text()
    assert "ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={'CPU': 1.0})" in text

    status, log = wait_for_job(ray_head, job_id)
    assert status == "SUCCEEDED", log[-6000:]
    state = json.loads((out / "gpuplan-state.json").read_text())
    res = state["results"]
    assert state["status"] == "completed" and res["world_size"] == 2 and res["engine"] == "ddp"
    assert state["job"]["id"] == job_id  # the job record survives the run
    assert res["global_step"] == STEPS and res["samples_seen"] == STEPS * 4  # effective batch 4 = 2 per device x 1 x 2 ranks
    train = [m for m in read_jsonl(out / "metrics.jsonl") if m["event"] == "train"]
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))
    assert (out / "final" / "model.safetensors").is_file()
    assert "--nnodes=2 --node_rank=1" in log and "--nnodes=2 --node_rank=0" in log  # each Ray worker ran one node of the plan

    code, shown, err = in_process(capsys, "show", out)
    assert code == 0, err
    assert f"ray job {job_id}, submitted" in shown and "remote job: SUCCEEDED (ray job status)" in shown


@pytest.mark.slow
def test_ray_job_status_reads_a_failed_job_and_asks_the_gcs_address_too(ray_head, job_client_env):
    """A job that fails, read by the engine's `ray job status`. Not one whose `gpuplan apply` fails: the rendered
    FailureConfig(max_failures=3) starts the worker group four times before the job fails (about 90 s here)."""
    argv, env = ray_job_command("submit", ["--no-wait", "--", "python", "-c", "raise SystemExit(3)"], ray_head.dashboard)
    said = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert said.returncode == 0, said.stderr[-3000:]
    job_id = said.stdout.split("Job '")[1].split("'")[0]
    assert wait_for_job(ray_head, job_id)[0] == "FAILED"
    for address in (ray_head.dashboard, ray_head.gcs):  # launch.ray_dashboard_address, or launch.ray_address's GCS
        status = ENGINE.status(job_id, address)
        assert (status.state, status.done, status.source) == ("FAILED", True, "ray job status")
        assert status.detail is not None and status.detail.startswith("Job entrypoint command failed with exit code 3")
    gone = ENGINE.status("raysubmit_noSuchJob", ray_head.dashboard)
    assert (gone.state, gone.done) == ("not found", None) and "does not exist" in str(gone.detail)


def test_a_dashboard_nobody_answers_at_is_named_with_its_key_and_the_fix(job_client_env, tmp_path, capsys):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = ray_spec(tmp_path, RayHead(gcs="127.0.0.1:1", dashboard=closed), f'ray_dashboard_address = "{closed}"')
    code, _, err = in_process(capsys, "apply", spec, "--yes")
    assert code == 1 and "Traceback" not in err
    assert f"ray job submit could not reach the Ray cluster at launch.ray_dashboard_address = '{closed}'" in err
    assert "Failed to connect to Ray at address" in err  # the client's own words
    assert 'set launch.ray_dashboard_address to the head\'s dashboard as this machine reaches it ("http://HEAD:8265")' in err
    assert not (tmp_path / "shared" / "runs" / "tiny" / "gpuplan-state.json").exists()  # nothing submitted, nothing recorded
