"""Slurm: the job as an sbatch script, submitted with sbatch, followed with squeue and sacct.

The script (sbatch(1), Slurm 22.05+):
- one task per node (`--nodes=N --ntasks-per-node=1`) with the node's cores (`--cpus-per-task`) and GPUs
  (`--gres=gpu:COUNT`); each task is `gpuplan apply PLAN --yes --in-job`, which starts torchrun for the
  node's ranks: node rank from SLURM_NODEID, rendezvous on the allocation's first host, which the script
  exports as MASTER_ADDR from `scontrol show hostnames "$SLURM_JOB_NODELIST"` (apply/launch/torchrun.py);
- `--time` is the job's time limit (job.py: the planned run with its margin);
- `--requeue` and `--signal=B:USR1@SECONDS`: near the time limit (or at preemption, where the cluster sets
  SlurmctldParameters=preempt_send_user_signal) the batch shell gets USR1, and its trap runs
  `scontrol requeue $SLURM_JOB_ID`. The requeued job starts the script again with the same job id; its
  `gpuplan apply` takes over the run lock its earlier instance left (lifecycle/run_lock.py, GPUPLAN_JOB_ID)
  and resumes from the last complete checkpoint, as any apply does (apply/launch/session.py);
- `--open-mode=append`: the log of every instance goes to the same file in the job dir.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpuplan.clusters.engine import Engine, RemoteStatus, SubmitError
from gpuplan.clusters.job import Job
from gpuplan.lifecycle.run_lock import JOB_ID_ENV

SCRIPT = "job.sbatch"
LOG = "slurm-%j.out"  # sbatch's filename pattern: %j is the job id
REQUEUE_SIGNAL_S = 300  # USR1 this long before the time limit: time to requeue (Slurm may send it up to 60 s earlier)

# squeue/sacct states (squeue(1) "JOB STATE CODES") after which the job runs no more
FINISHED = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED"}
)


def sbatch_script(job: Job) -> str:
    """The sbatch script of `job`."""
    r = job.resources
    opts = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={r.cpus_per_node}",
    ]
    if r.gpus_per_node:
        opts.append(f"--gres=gpu:{r.gpus_per_node}")
    if r.memory_gib_per_node:
        opts.append(f"--mem={int(r.memory_gib_per_node) + 1}G")
    opts.append(f"--time={job.time_limit.hms()}")
    for key in ("partition", "account", "qos"):
        value = getattr(job.launch, key)
        if value:
            opts.append(f"--{key}={value}")
    signal_s = min(REQUEUE_SIGNAL_S, max(60, job.time_limit.seconds // 10))
    opts += [
        "--requeue",
        f"--signal=B:USR1@{signal_s}",
        "--open-mode=append",
        f"--output={job.job_dir}/{LOG}",
        f"--chdir={job.job_dir}",
    ]
    srun = [
        "srun",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={r.cpus_per_node}",  # srun does not inherit sbatch's --cpus-per-task (Slurm 22.05 NEWS)
        "--kill-on-bad-exit=1",
        *job.command,
    ]
    env = {**job.env}
    lines = [
        "#!/bin/bash",
        f"# gpuplan: {job.nodes} node(s) x {r.processes_per_node} rank(s), written by `gpuplan apply` from {job.plan_file}",
        f"# time limit {job.time_limit.hms()}: {job.time_limit.reason()}",
        *(f"#SBATCH {o}" for o in opts),
        "",
        "set -uo pipefail",
        "# a requeued instance (the same job id) takes over the run lock of the one before it",
        f'export {JOB_ID_ENV}="slurm:${{SLURM_JOB_ID}}"',
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())),
        "# rendezvous: the allocation's first host; each task's node rank is SLURM_NODEID",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        'echo "gpuplan: job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST}, rendezvous ${MASTER_ADDR}"',
        "",
        "requeue() {",
        '  echo "gpuplan: USR1 (time limit near, or preemption): requeueing job ${SLURM_JOB_ID}; it resumes from the last checkpoint"',
        '  scontrol requeue "${SLURM_JOB_ID}"',
        "}",
        "trap requeue USR1",
        "",
        shlex.join(srun) + " &",
        "step=$!",
        'wait "$step"; status=$?',
        'while kill -0 "$step" 2>/dev/null; do wait "$step"; status=$?; done  # a trapped signal ends wait early',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


class Slurm(Engine):
    target = "slurm"
    client = "sbatch"

    def render(self, job: Job) -> dict[str, str]:
        return {SCRIPT: sbatch_script(job)}

    def missing_client(self) -> str | None:
        absent = [b for b in ("sbatch", "squeue", "scontrol") if shutil.which(b) is None]
        if not absent:
            return None
        return (
            f"{', '.join(absent)} not found on PATH: Slurm's client commands (Debian/Ubuntu package slurm-client; "
            "a cluster's login node has them)"
        )

    def submit(self, job: Job, files: Mapping[str, Path]) -> str:
        script = files[SCRIPT]
        out = _run(["sbatch", "--parsable", str(script)])
        if out.returncode != 0:
            raise SubmitError(
                f"sbatch refused {script}: {_words(out)}",
                key="launch.target",
                fix="fix what sbatch names (partition, account, qos in [launch]), then run gpuplan apply again",
            )
        job_id = out.stdout.strip().split(";", 1)[0]  # --parsable: "ID" or "ID;CLUSTER"
        if not job_id.isdigit():
            raise SubmitError(f"sbatch answered {out.stdout.strip()!r}, not a job id", key="launch.target")
        return job_id

    def status(self, job_id: str, address: str | None = None) -> RemoteStatus:
        q = _run(["squeue", "--noheader", "--states=all", "--jobs", job_id, "--format=%T|%r|%M|%N"])
        rows = [line for line in q.stdout.splitlines() if line.strip()]
        if q.returncode == 0 and rows:
            state, reason, elapsed, nodes = (rows[0].split("|") + ["", "", ""])[:4]
            detail = ", ".join(x for x in (f"reason {reason}" if reason and reason != "None" else "", f"elapsed {elapsed}", nodes) if x)
            return RemoteStatus(state=state, done=state in FINISHED, source="squeue", detail=detail or None)
        a = _run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", job_id, "--format=State,ExitCode,Elapsed"])
        rows = [line for line in a.stdout.splitlines() if line.strip()]
        if a.returncode == 0 and rows:
            state, code, elapsed = (rows[-1].split("|") + ["", ""])[:3]
            word = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
            return RemoteStatus(state=word, done=word in FINISHED, source="sacct", detail=f"exit code {code}, elapsed {elapsed}")
        why = _words(a) if a.returncode != 0 else "no record"
        return RemoteStatus(state="unknown", done=None, source="squeue, sacct", detail=f"squeue no longer lists job {job_id}; sacct: {why}")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 127, "", str(e))


def _words(p: subprocess.CompletedProcess[str]) -> str:
    text = (p.stderr or p.stdout).strip()
    return text.splitlines()[-1] if text else f"exit status {p.returncode}"


ENGINE = Slurm()
