"""One apply per output dir: a lock file naming its holder (pid, host, since).

Created with O_CREAT | O_EXCL, so two applies racing cannot both win. A lock whose
process is gone (same host, pid not alive) is reported as stale and can be broken
with --break-lock; a lock held from another host is never judged dead from here.

A cluster job (gpuplan/clusters/) runs with GPUPLAN_JOB_ID = "<target>:<the engine's job id>" and
writes it into the lock. The engine runs one instance of a job id at a time, so a lock left by the
same job id is its own earlier instance, killed by a preemption or a requeue (on whichever node it
ran): the requeued job takes it over instead of waiting on a dead holder.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone

from gpuplan.errors import LockError
from gpuplan.lifecycle.run_dir import LOCK_FILE

__all__ = ["JOB_ID_ENV", "LOCK_FILE", "Holder", "LockError", "RunLock", "read_holder"]

JOB_ID_ENV = "GPUPLAN_JOB_ID"


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    since: str
    job: str | None = None  # GPUPLAN_JOB_ID of a cluster job

    def alive(self) -> bool | None:
        """True/False on this host; None when the holder is on another host (cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def read_holder(output_dir: str) -> Holder | None:
    try:
        with open(os.path.join(output_dir, LOCK_FILE), encoding="utf-8") as f:
            d = json.load(f)
        job = d.get("job")
        return Holder(int(d["pid"]), str(d["host"]), str(d["since"]), str(job) if job else None)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Holder(-1, "?", "?")  # unreadable: treat as held by an unknown process


class RunLock:
    """Context manager: `with RunLock(dir, break_stale=False): ...`."""

    def __init__(self, output_dir: str, *, break_stale: bool = False):
        self.path = os.path.join(output_dir, LOCK_FILE)
        self.output_dir = output_dir
        self.break_stale = break_stale
        self.held = False
        self.created_dir = False  # the lock made output.dir: an apply that wrote nothing removes it again

    def acquire(self) -> None:
        self.created_dir = not os.path.isdir(self.output_dir)
        os.makedirs(self.output_dir, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        job = os.environ.get(JOB_ID_ENV) or None
        if job:
            me["job"] = job
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = read_holder(self.output_dir)
                if holder is None:
                    continue  # released between our open and read: try again
                alive = holder.alive()
                who = f"pid {holder.pid} on {holder.host} since {holder.since}"
                if job and holder.job == job and alive is not True:  # this job's instance before a requeue
                    os.unlink(self.path)
                    continue
                if alive is False and self.break_stale:
                    os.unlink(self.path)
                    continue
                if alive is False:
                    raise LockError(
                        f"{self.output_dir} is locked by {who}, which is no longer running (a crashed apply)",
                        key="output.dir",
                        fix="rerun with --break-lock to take it over",
                    ) from None
                raise LockError(
                    f"{self.output_dir} is in use by another apply: {who}",
                    key="output.dir",
                    detail="two runs must not write one output dir",
                    fix="wait for it, or stop it",
                ) from None
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(me, f)
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            return
        raise LockError(f"could not lock {self.output_dir}", key="output.dir")

    def release(self) -> None:
        if self.held:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.held = False
            if self.created_dir:  # refused before the run wrote anything: leave no empty output dir behind
                try:
                    os.rmdir(self.output_dir)
                except OSError:
                    pass  # not empty: the run's files stay

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
