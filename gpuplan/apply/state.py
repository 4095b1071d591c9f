"""gpuplan-state.json: the applied plan and what the run measured.

Written atomically (temp file in the same directory, fsync, os.replace) so a reader
never sees half a file, even when the run is killed mid-write. Shape (format 1):

    {format_version, plan: Plan.to_dict(), status: running|completed|failed|interrupted,
     started_at, finished_at (ISO 8601 UTC or null), error (message or null),
     resumed_from (checkpoint dir or null),
     oom_replans: [{step, from: {batch, accumulation}, to: {...}, error, estimated_allocated_bytes,
                    capacity_bytes, estimate_low_by_at_least, resumed_from}] (apply/oom.py),
     progress: {global_step, max_steps, samples_seen},
     results: {peak_allocated_bytes, peak_reserved_bytes (CUDA) | peak_rss_bytes (CPU),
               tokens_per_second, train_loss_first, train_loss_last, runtime_s, ...}}
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from typing import Any

from gpuplan.plan.types import Plan

STATE_FILE = "gpuplan-state.json"
STATE_FORMAT_VERSION = 1


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str, data: Any) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpuplan-state-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(directory, os.O_RDONLY)  # the rename itself survives a power cut only once the dir is synced
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_state(output_dir: str) -> dict[str, Any] | None:
    """The last state written in `output_dir`, or None when there is none."""
    path = os.path.join(output_dir, STATE_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class RunState:
    """The state file of one run; every method rewrites the whole file atomically."""

    def __init__(self, plan: Plan, output_dir: str, resumed_from: str | None = None):
        self.path = os.path.join(output_dir, STATE_FILE)
        # Under torchrun every rank runs execute(); only rank 0 owns the file.
        self.enabled = int(os.environ.get("RANK", "0")) == 0
        max_steps = plan.get("training.max_steps")
        self.data: dict[str, Any] = {
            "format_version": STATE_FORMAT_VERSION,
            "plan": plan.to_dict(),
            "status": "running",
            "started_at": _now(),
            "finished_at": None,
            "error": None,
            "resumed_from": resumed_from,
            "oom_replans": [],
            "progress": {"global_step": 0, "max_steps": max_steps, "samples_seen": 0},
            "results": {},
        }
        self._write()

    def _write(self) -> None:
        if self.enabled:
            write_json_atomic(self.path, self.data)

    def progress(self, global_step: int, max_steps: int | None, samples_seen: int) -> None:
        self.data["progress"] = {"global_step": global_step, "max_steps": max_steps, "samples_seen": samples_seen}
        self._write()

    def replanned(self, plan: Plan, record: dict[str, Any]) -> None:
        """An out-of-memory re-plan: the state now holds the plan actually being applied."""
        self.data["plan"] = plan.to_dict()
        self.data["oom_replans"].append(record)
        self._write()

    def finish(self, status: str, results: dict[str, Any], error: str | None = None) -> None:
        self.data.update(status=status, finished_at=_now(), error=error, results=dict(results))
        self._write()
