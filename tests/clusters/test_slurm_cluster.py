"""Slurm for real: `gpuplan apply` of a [launch] target = "slurm" spec submits an sbatch job to the one-node
cluster (tests/clusters/conftest.py), whose srun task runs `gpuplan apply PLAN --in-job` with two CPU ranks
under torchrun; mid-run the batch shell gets USR1 (what Slurm sends before the time limit or at preemption)
and its trap runs `scontrol requeue`, which kills the run; the requeued job takes over its run lock, resumes
from the last complete checkpoint and trains to the end. `gpuplan show` reports the job from squeue.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from gpuplan.cli.main import main
from gpuplan.lifecycle.run_dir import CHECKPOINT_PREFIX
from tests.helpers.apply_plans import CORPUS, REPO

pytestmark = pytest.mark.slow

MODEL = str(REPO / "specs" / "models" / "tiny-llama-cpu.json")
MAX_STEPS = 40
SAVE_STEPS = 4


def spec(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    path = tmp_path / "slurm-run.toml"
    path.write_text(f"""
[model]
config = "{MODEL}"
from_scratch = true

[hardware]
gpu = "cpu"
count = 2

[data]
train_files = ["{CORPUS}"]
seq_len = 64

[training]
effective_batch_size = 8
per_device_train_batch_size = 4
max_steps = {MAX_STEPS}
logging_steps = 1
save_steps = {SAVE_STEPS}
seed = 0

[distributed]
strategy = "ddp"

[output]
dir = "{shared / "run"}"

[launch]
target = "slurm"
storage = "{shared}"
gpuplan_command = "{sys.executable} -m gpuplan"
startup_minutes = 5
""")
    return path


def wait_for(what: str, ok, timeout: float, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log.exists() else "(no job log)"
    raise AssertionError(f"{what} did not happen in {timeout:.0f} s; the job's log ends:\n{tail}")


def complete_checkpoints(run: Path) -> list[int]:
    """Steps of the checkpoints apply counts as complete (apply/train/checkpoints.py writes its marker last)."""
    return sorted(
        int(d.name[len(CHECKPOINT_PREFIX) :]) for d in run.glob(CHECKPOINT_PREFIX + "*") if (d / "gpuplan-checkpoint.json").is_file()
    )


def squeue_state(slurm, job_id: str) -> str:
    return slurm.run("squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T").stdout.strip()


def test_a_requeued_job_resumes_from_its_last_checkpoint(slurm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_CONF", slurm.conf)  # sbatch exports this environment to the job
    path = spec(tmp_path)
    run = tmp_path / "shared" / "run"
    assert main(["apply", str(path), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "Job (slurm): slurm-run, 1 node x 2 CPU ranks" in out and "time limit 00:06:00" in out
    state = json.loads((run / "gpuplan-state.json").read_text())
    job_id = state["job"]["id"]
    assert state["status"] == "submitted" and state["job"]["target"] == "slurm" and f"Submitted slurm job {job_id}" in out
    log = run / "gpuplan-job" / f"slurm-{job_id}.out"

    # mid-run: a complete checkpoint exists and the run has not finished. USR1 to the batch shell, as Slurm sends
    # it before the time limit (--signal=B:USR1@...) or at preemption: the script's trap runs scontrol requeue
    first = wait_for("a checkpoint", lambda: complete_checkpoints(run), 240, log)[0]
    assert first < MAX_STEPS
    r = slurm.run("scancel", "--batch", "--signal=USR1", job_id)
    assert r.returncode == 0, r.stderr
    killed_after = complete_checkpoints(run)[-1]
    assert killed_after < MAX_STEPS, "the run ended before it was requeued: make it longer"
    wait_for("the requeue", lambda: squeue_state(slurm, job_id) == "PENDING", 60, log)
    # Slurm holds a requeued job back for a while (its BeginTime); let it start now
    assert slurm.run("scontrol", "update", f"JobId={job_id}", "StartTime=now").returncode == 0

    wait_for("the end of the job", lambda: squeue_state(slurm, job_id) in ("COMPLETED", "FAILED", ""), 300, log)
    text = log.read_text()
    assert squeue_state(slurm, job_id) == "COMPLETED", text[-3000:]
    assert f"gpuplan: USR1 (time limit near, or preemption): requeueing job {job_id}" in text  # the trap ran
    assert f"job {job_id} (restart 1)" in text  # the same job id, started again by Slurm

    state = json.loads((run / "gpuplan-state.json").read_text())
    assert state["status"] == "completed" and state["job"]["id"] == job_id  # the job record survives the run
    resumed = int(Path(state["resumed_from"]).name[len(CHECKPOINT_PREFIX) :])
    assert resumed >= killed_after and resumed % SAVE_STEPS == 0
    assert state["results"]["global_step"] == MAX_STEPS
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"event": "train"' in line]
    killed_at = len(steps) - (MAX_STEPS - resumed)  # the last step the first instance logged
    assert killed_at >= resumed
    # the first instance from step 1 until it was killed, then the second from the step after its checkpoint
    assert steps == list(range(1, killed_at + 1)) + list(range(resumed + 1, MAX_STEPS + 1))

    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    shown = capsys.readouterr().out
    assert f"slurm job {job_id}" in shown and "remote job: COMPLETED (squeue" in shown
