"""Ray hand-off (gpuplan/clusters/ray.py): a local Ray cluster runs the rendered TorchTrainer job to the end.

The plan: the tiny CPU Llama on 2 "nodes" x 1 CPU rank (DDP over gloo). `gpuplan apply --dry-run`'s
hand-off writes the job dir (saved plan, spec copy, ray_job.py); a Ray head started for this test
(`ray start --head --block`, its temp dir under the test's tmp dir, its process group ended at the end)
runs `python ray_job.py`: two Ray Train workers, each `gpuplan apply` of the saved plan for its node
rank, torchrun across the two. The run's state and metrics are read back from output.dir.
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
from pathlib import Path

import pytest

from gpuplan.clusters.handoff import hand_off
from gpuplan.clusters.ray import SCRIPT_FILE
from gpuplan.plan.build import plan_file
from gpuplan.plan.inputs.environment import local_environment
from tests.helpers.apply_plans import CORPUS, REPO, read_jsonl
from tests.helpers.cli_runs import BOOT
from tests.helpers.forked import SOCKET_VAR, socket_for

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'ray[train]')")
MODEL = REPO / "specs" / "models" / "tiny-llama-cpu.json"
STEPS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_spec(tmp_path: Path, gcs_port: int, master_port: int) -> Path:
    path = tmp_path / "tiny-ray.toml"
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
master_port = {master_port}

[output]
dir = "{tmp_path / "shared" / "runs" / "tiny"}"

[launch]
target = "ray"
storage = "{tmp_path / "shared"}"
gpuplan_command = "{sys.executable} -m gpuplan"
ray_address = "127.0.0.1:{gcs_port}"
startup_minutes = 5
""")
    return path


def start_ray_head(temp_dir: Path, port: int, env: dict[str, str]) -> subprocess.Popen:
    argv = [
        str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
        f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats",
    ]  # fmt: skip
    head = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # the GCS answers once the head is up
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return head
        except OSError:
            if head.poll() is not None:
                raise RuntimeError(f"ray start exited {head.returncode}: {head.stdout.read() if head.stdout else ''}") from None
            time.sleep(1)
    stop(head)
    raise RuntimeError("the Ray head did not come up in 120 s")


def stop(head: subprocess.Popen) -> None:
    """End the head and everything it started (its own session): GCS, raylet, workers.

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


@pytest.mark.slow
def test_a_local_ray_cluster_runs_the_rendered_torchtrainer_job_to_the_end(tmp_path):
    gcs_port, master_port = free_port(), free_port()
    spec = ray_spec(tmp_path, gcs_port, master_port)
    plan = plan_file(spec, environment=local_environment())
    said: list[str] = []
    assert hand_off(plan, target=str(spec), dry_run=True, confirm=lambda: None, echo=said.append) == 0
    job_dir = tmp_path / "shared" / "runs" / "tiny" / "gpuplan-job"
    script = job_dir / SCRIPT_FILE
    text = script.read_text()
    assert "ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={'CPU': 1.0})" in text

    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env |= {"PYTHONPATH": f"{REPO}{os.pathsep}{BOOT}", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    # a cluster of the test's own without token authentication, whatever ~/.ray/auth_token the user has (ray 2.60 reads it)
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # stop() ends a node that has finished: nothing to drain
    # each Ray worker's `gpuplan apply`, its torchrun agent and ranks are forked from this test worker's
    # pre-imported server through the boot shim (tests/helpers/forked.py socket_for); fresh ones where it cannot
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")  # what the workers' commands put there (torchrun's torchelastic_* folders) is the test's
    served = socket_for(env)
    if served is not None:
        env[SOCKET_VAR] = served
    # Ray's session sockets live under its temp dir, and an AF_UNIX path holds at most 107 bytes
    # (ray/_private/utils.py validate_socket_filepath): a short folder of the test's own, not one under tmp_path
    ray_temp = tempfile.mkdtemp(prefix="ray-")
    try:
        head = start_ray_head(Path(ray_temp), gcs_port, env)
        try:
            run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
        finally:
            stop(head)
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]

    out = tmp_path / "shared" / "runs" / "tiny"
    state = json.loads((out / "gpuplan-state.json").read_text())
    res = state["results"]
    assert state["status"] == "completed" and res["world_size"] == 2 and res["engine"] == "ddp"
    assert res["global_step"] == STEPS and res["samples_seen"] == STEPS * 4  # effective batch 4 = 2 per device x 1 x 2 ranks
    train = [m for m in read_jsonl(out / "metrics.jsonl") if m["event"] == "train"]
    assert [m["step"] for m in train] == list(range(1, STEPS + 1))
    assert (out / "final" / "model.safetensors").is_file()
    log = run.stdout + run.stderr
    assert "--nnodes=2 --node_rank=1" in log and "--nnodes=2 --node_rank=0" in log  # each Ray worker ran one node of the plan
