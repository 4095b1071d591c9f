"""The hand-off without a cluster: [launch] validation, the Job a plan becomes (nodes x GPUs, the time limit
and its margin, the command, storage), the sbatch script, and `gpuplan plan` / `apply --dry-run` / a missing
client through the CLI (in-process: the hand-off is torch-free)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import subprocess
from pathlib import Path

import pytest

from gpuplan.cli.main import main
from gpuplan.clusters.job import JOB_DIR, PLAN_FILE, JobError, job_for
from gpuplan.clusters.slurm import SCRIPT, sbatch_script
from gpuplan.errors import GpuplanError
from gpuplan.lifecycle.run_lock import JOB_ID_ENV, LockError, RunLock
from gpuplan.lifecycle.state import RunState, load_state, record_submission
from gpuplan.plan.build import plan_file
from gpuplan.plan.fingerprint import stale_reasons
from gpuplan.plan.inputs.environment import local_environment
from gpuplan.plan.types import Plan
from gpuplan.spec.validate import validate_spec
from tests.helpers.planning import ENV, MODELS, SPECS

SHIPPED = SPECS / "llama-8b-2nodes-slurm.toml"


def two_nodes(tmp_path: Path, launch: str, *, output: str | None = None, extra: str = "") -> Path:
    """The shipped multi-node plan with its own [launch] (and output.dir) in tmp_path."""
    out = output or str(tmp_path / "shared" / "runs" / "x")
    text = f"""
[model]
config = "{MODELS}/llama-3.1-8b.json"
dtype = "bfloat16"

[hardware]
gpu = "H100-80GB"
count = 8
nodes = 2

[data]
seq_len = 2048

[training]
effective_batch_size = 128
max_steps = 1000
{extra}

[output]
dir = "{out}"

[launch]
{launch}
"""
    path = tmp_path / "two-nodes.toml"
    path.write_text(text)
    return path


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(GpuplanError) as e:
        validate_spec(raw)
    return [f"{d.key}: {d.summary} | {d.fix}" for d in e.value.diagnostics]


BASE = {"model": {"config": "config.json"}}


@pytest.mark.parametrize(
    ("launch", "says"),
    [
        ({"target": "slurmm"}, '"slurmm" is not a launch target; did you mean "slurm"?'),
        ({"target": "slurm", "partiton": "gpu"}, "launch.partiton: unknown key; did you mean partition?"),
        ({"target": "kubernetes", "partition": "gpu", "image": "x"}, 'launch.partition is for launch.target = "slurm", not "kubernetes"'),
        ({"target": "skypilot"}, 'launch.target = "skypilot" needs launch.image'),
        ({"storage": "shared"}, "launch.storage = 'shared' is not an absolute path"),
        ({"target": "slurm", "time_margin": -1}, "launch.time_margin = -1: should be >= 0"),
    ],
)
def test_launch_is_validated_like_the_rest(launch, says):
    problems = errors_of({**BASE, "launch": launch})
    assert any(says in p for p in problems), problems


def test_the_shipped_spec_becomes_a_two_node_job_with_the_planned_time_limit():
    plan = plan_file(SHIPPED, environment=ENV)
    job = job_for(plan)
    t = plan.throughput
    assert job.target == "slurm" and job.nodes == 2 and job.world_size == 16
    assert job.resources.gpus_per_node == 8 and job.resources.gpu == "H100-80GB"
    high = t.time_interval["run_time_s"][1]
    assert high > t.run_time_s  # the limit starts from the high end of the plan's range
    assert job.time_limit.seconds == math.ceil((high * 1.25 + 600) / 60) * 60
    assert job.time_limit.seconds % 60 == 0 and job.time_limit.source == "planned"
    assert job.command == ("gpuplan", "apply", "/shared/runs/llama-8b-2nodes/gpuplan-job/plan.json", "--yes", "--in-job")
    assert job.storage == "/shared" and job.job_dir == f"/shared/runs/llama-8b-2nodes/{JOB_DIR}"


def test_a_time_limit_is_written_as_slurm_reads_it():
    plan = plan_file(SHIPPED, environment=ENV)
    launch = plan.resolved.launch
    for minutes, hms in ((59, "00:59:00"), (90, "01:30:00"), (1441, "1-00:01:00")):
        job = job_for(plan, dataclasses.replace(launch, time_limit_minutes=minutes))
        assert job.time_limit.hms() == hms and job.time_limit.source == "user"


def test_the_sbatch_script_runs_srun_and_torchrun_on_every_node_and_requeues():
    plan = plan_file(SHIPPED, environment=ENV)
    job = job_for(plan)
    script = sbatch_script(job)
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:8",
        f"#SBATCH --time={job.time_limit.hms()}",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml-research",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f'export {JOB_ID_ENV}="slurm:${{SLURM_JOB_ID}}"',
        "trap requeue USR1",
        '  scontrol requeue "${SLURM_JOB_ID}"',
    ):
        assert line in script.splitlines(), line
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert srun.endswith("gpuplan apply /shared/runs/llama-8b-2nodes/gpuplan-job/plan.json --yes --in-job &")
    assert "--nodes=2 --ntasks-per-node=1" in srun
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0


def test_several_nodes_without_shared_storage_are_refused(tmp_path, capsys):
    path = two_nodes(tmp_path, 'target = "slurm"')
    assert main(["plan", str(path)]) == 1
    err = capsys.readouterr().err
    assert "hardware.nodes = 2 on launch.target = 'slurm' but launch.storage is not set" in err
    assert 'fix: set launch.storage to where the shared file system is mounted on every node ("/shared")' in err


def test_an_output_dir_off_the_storage_is_refused_and_the_fix_plans(tmp_path, capsys):
    shared = tmp_path / "shared"
    path = two_nodes(tmp_path, f'target = "slurm"\nstorage = "{shared}"', output=str(tmp_path / "elsewhere" / "x"))
    with pytest.raises(JobError) as e:
        job_for(plan_file(path, environment=ENV))
    d = e.value.diagnostics[0]
    assert d.key == "output.dir" and "is not under launch.storage" in d.summary
    fixed = d.fix.removeprefix("set output.dir = ").strip('"')
    assert job_for(plan_file(two_nodes(tmp_path, f'target = "slurm"\nstorage = "{shared}"', output=fixed), environment=ENV))


def test_a_time_limit_shorter_than_the_planned_run_is_refused_and_the_fix_plans(tmp_path):
    shared = tmp_path / "shared"
    launch = f'target = "slurm"\nstorage = "{shared}"\n'
    with pytest.raises(JobError) as e:
        job_for(plan_file(two_nodes(tmp_path, launch + "time_limit_minutes = 5"), environment=ENV))
    d = e.value.diagnostics[0]
    assert d.key == "launch.time_limit_minutes" and "is shorter than the planned run" in d.summary
    minutes = int(d.fix.split("= ")[1].split()[0])
    job = job_for(plan_file(two_nodes(tmp_path, launch + f"time_limit_minutes = {minutes}"), environment=ENV))
    assert job.time_limit.minutes == minutes == job_for(plan_file(two_nodes(tmp_path, launch), environment=ENV)).time_limit.minutes


def test_a_fixed_rendezvous_host_is_refused_where_the_engine_picks_the_nodes(tmp_path):
    shared = tmp_path / "shared"
    path = two_nodes(tmp_path, f'target = "slurm"\nstorage = "{shared}"', extra='[distributed]\nmaster_addr = "node0"')
    with pytest.raises(JobError, match="distributed.master_addr = 'node0' names a fixed rendezvous host"):
        job_for(plan_file(path, environment=ENV))


def test_plan_prints_the_job_and_json_carries_it(capsys):
    assert main(["plan", str(SHIPPED), "--gpu", "H100-80GB"]) == 0
    text = capsys.readouterr().out
    assert "Job (slurm): llama-8b-2nodes-slurm, 2 nodes x 8 H100-80GB GPUs (16 ranks), 72 CPUs per node" in text
    assert "x 1.25 (launch.time_margin = 0.25) + 10 min start-up and final save" in text
    assert "each node runs: gpuplan apply /shared/runs/llama-8b-2nodes/gpuplan-job/plan.json --yes --in-job" in text
    assert main(["plan", str(SHIPPED), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["job"]["nodes"] == 2 and data["job"]["resources"]["gpus_per_node"] == 8
    assert data["job"]["time_limit"]["margin"] == 0.25


def test_a_missing_client_is_refused_naming_it_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = two_nodes(tmp_path, f'target = "slurm"\nstorage = "{tmp_path / "shared"}"')
    assert main(["apply", str(path), "--yes"]) == 1
    err = capsys.readouterr().err
    assert "sbatch, squeue, scontrol not found on PATH: Slurm's client commands (Debian/Ubuntu package slurm-client" in err
    assert f"fix: install it, or write the job without submitting it: gpuplan apply {path} --dry-run" in err
    assert not (tmp_path / "shared").exists()


def test_dry_run_writes_the_job_and_the_saved_plan_it_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no client needed
    shared = tmp_path / "shared"
    path = two_nodes(tmp_path, f'target = "slurm"\nstorage = "{shared}"\npartition = "gpu"')
    assert main(["apply", str(path), "--dry-run"]) == 0
    job_dir = shared / "runs" / "x" / JOB_DIR
    assert sorted(p.name for p in job_dir.iterdir()) == sorted([SCRIPT, PLAN_FILE, path.name])
    saved = Plan.from_dict(json.loads((job_dir / PLAN_FILE).read_text()))
    assert saved.spec_path == str(job_dir / path.name)  # the copy: the job checks the plan against it
    assert (job_dir / path.name).read_bytes() == path.read_bytes()
    # what the job's apply checks (cli/state.py check_saved_plan): the copy's hash, the settings, the packages
    copy_sha = hashlib.sha256((job_dir / path.name).read_bytes()).hexdigest()
    assert stale_reasons(saved, spec_sha256_now=copy_sha, hardware_now=None, environment_now=local_environment()) == []
    assert (job_dir / SCRIPT).read_text() == sbatch_script(job_for(saved))
    assert load_state(shared / "runs" / "x") is None  # nothing submitted, nothing recorded


def test_dry_run_of_a_local_plan_is_refused(tmp_path, capsys):
    assert main(["apply", str(SPECS / "tiny.toml"), "--dry-run"]) == 1
    assert '--dry-run writes a cluster job, and launch.target = "local" trains here' in capsys.readouterr().err


def test_the_job_record_survives_the_run_state_the_job_writes(tmp_path):
    plan = plan_file(SHIPPED, environment=ENV)
    out = str(tmp_path / "run")
    Path(out).mkdir()
    record_submission(plan, out, {"target": "slurm", "id": "42", "submitted_at": "now", "job_dir": out})
    state = load_state(out)
    assert state is not None and state["status"] == "submitted" and state["job"]["id"] == "42"
    RunState(plan, out)  # what the job's apply writes when it starts
    state = load_state(out)
    assert state is not None and state["status"] == "running" and state["job"]["id"] == "42"


def test_a_requeued_job_takes_over_the_lock_of_its_earlier_instance_only(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    dead = {"pid": 1, "host": "another-node", "since": "2026-01-01T00:00:00+00:00", "job": "slurm:7"}
    (out / ".gpuplan.lock").write_text(json.dumps(dead))
    monkeypatch.setenv(JOB_ID_ENV, "slurm:8")  # another job: the holder on another host cannot be judged
    with pytest.raises(LockError, match="in use by another apply"):
        RunLock(str(out)).acquire()
    monkeypatch.setenv(JOB_ID_ENV, "slurm:7")  # the same job id, started again by the engine
    with RunLock(str(out)):
        assert json.loads((out / ".gpuplan.lock").read_text())["job"] == "slurm:7"


def test_show_reports_the_submitted_job_and_what_the_engine_says(tmp_path, monkeypatch, capsys):
    """No Slurm client on PATH: the state's job is shown, and the engine's status says why it is unknown."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    plan = plan_file(SHIPPED, environment=ENV)
    out = tmp_path / "run"
    out.mkdir()
    record_submission(plan, str(out), {"target": "slurm", "id": "42", "submitted_at": "2026-01-01T00:00:00+00:00", "job_dir": "d"})
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Run in" in text and ": submitted" in text
    assert "slurm job 42, submitted 2026-01-01T00:00:00+00:00; its files in d" in text
    assert "remote job: unknown (none; sbatch, squeue, scontrol not found on PATH" in text
    assert main(["show", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["remote_job"]["state"] == "unknown"


def test_a_saved_gpu_plan_is_handed_off_from_a_cpu_machine_and_checked_on_the_node(tmp_path, monkeypatch, capsys):
    """The submitting machine (a login node, this CPU) checks the spec and the settings; the hardware and the
    packages are the job's to check, on the node (--in-job)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = two_nodes(tmp_path, f'target = "slurm"\nstorage = "{tmp_path / "shared"}"')
    saved = tmp_path / "run.plan.json"
    assert main(["plan", str(path), "--out", str(saved)]) == 0
    assert main(["apply", str(saved), "--dry-run"]) == 0
    plan_json = tmp_path / "shared" / "runs" / "x" / JOB_DIR / PLAN_FILE
    assert plan_json.is_file()
    capsys.readouterr()
    assert main(["apply", str(plan_json), "--yes", "--in-job"]) == 1  # what the job runs, here on a CPU
    assert "stale plan: planned for H100-80GB, this machine has cpu" in capsys.readouterr().err
