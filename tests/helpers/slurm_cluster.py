"""A one-node Slurm cluster on this machine, from Debian's slurm-wlm: munged, slurmctld and slurmd on
localhost, every file (config, key, sockets, state, spool, logs) in one folder, torn down by `stop`.

Used by tests/clusters/conftest.py (a session fixture in a tmp dir) and by .ci/run's set-up
(`python -m tests.helpers.slurm_cluster check DIR`: start, run one job, stop). The node is this host with
its own CPUs and no GPUs (no gres); processes are tracked by proctrack/linuxproc, with no cgroups, so it
runs in a container as root. Ports are free ones picked at start, so it never meets another Slurm here.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
PACKAGE = "slurm-wlm"  # Debian: slurmctld, slurmd, slurm-client; munge comes with it


def missing() -> list[str]:
    """The Slurm and munge binaries this machine lacks."""
    return [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(root: Path, host: str, cpus: int) -> str:
    return "\n".join(
        [
            "ClusterName=gpuplantest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root}/munge.sock",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc",  # no cgroups: runs in a container
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",  # no slurmdbd: sacct has no records here
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "MinJobAge=600",  # squeue keeps a finished job for 10 minutes: its final state is readable
            "KillWait=5",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


@dataclass
class SlurmCluster:
    root: Path
    host: str
    env: dict[str, str] = field(default_factory=dict)  # SLURM_CONF for the clients

    @property
    def conf(self) -> str:
        return self.env["SLURM_CONF"]

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env={**os.environ, **self.env}, check=False)

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            r = self.run("sinfo", "--noheader", "--format=%T")
            last = (r.stdout + r.stderr).strip()
            if r.returncode == 0 and last in ("idle", "mixed", "allocated"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node did not come up in {timeout:.0f} s (sinfo: {last!r}); logs in {self.root / 'log'}")

    def stop(self) -> None:
        """scancel every job, then stop slurmd, slurmctld and munged (the pids they wrote), and wait for them."""
        self.run("scancel", "--full", "--user=root", timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            pid_file = self.root / f"{name}.pid"
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def start(root: Path) -> SlurmCluster:
    """munged, slurmctld and slurmd with everything under `root`; the node is up when this returns."""
    root.mkdir(parents=True, exist_ok=True)
    for d in ("state", "spool", "log"):
        (root / d).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    key = root / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_config(root, host, os.cpu_count() or 1))
    cluster = SlurmCluster(root, host, {"SLURM_CONF": str(conf)})
    steps = [
        [
            _binary("munged"),
            "--force",
            f"--socket={root}/munge.sock",
            f"--key-file={key}",
            f"--log-file={root}/log/munged.log",
            f"--pid-file={root}/munged.pid",
            f"--seed-file={root}/munged.seed",
        ],
        [_binary("slurmctld"), "-f", str(conf), "-i"],  # -i: ignore any saved state
        [_binary("slurmd"), "-f", str(conf)],
    ]
    try:
        for argv in steps:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **cluster.env}, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"{Path(argv[0]).name} did not start: {(r.stderr or r.stdout).strip()}")
            if argv[0].endswith("slurmctld"):
                _wait_for(lambda: cluster.run("scontrol", "ping").returncode == 0, 30, "slurmctld")
        cluster.wait_idle()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(ok, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not answer in {timeout:.0f} s")


def check(root: Path) -> int:
    """.ci/run's set-up check: the cluster starts and runs one srun job step; always stopped again."""
    cluster = start(root)
    try:
        r = cluster.run("srun", "--nodes=1", "--ntasks=1", "hostname", timeout=120)
        print(f"slurm: one-node cluster on {cluster.host}: srun hostname -> {r.stdout.strip() or r.stderr.strip()}")
        return r.returncode
    finally:
        cluster.stop()


if __name__ == "__main__":  # python -m tests.helpers.slurm_cluster check DIR
    if len(sys.argv) != 3 or sys.argv[1] != "check":
        sys.exit("usage: python -m tests.helpers.slurm_cluster check DIR")
    sys.exit(check(Path(sys.argv[2])))
