"""Evaluations written into the run's gpuplan-state.json ("evaluations": a list, newest last).

Each entry: {at (ISO 8601 UTC), step (of the weights scored), checkpoint (N or null),
data (the eval files, or "the run's eval split"), eval_loss, perplexity, eval_sequences,
tasks: {task: {metric: value}}}. Written under the run's lock (lifecycle/run_lock.py) and
atomically, so an apply starting meanwhile waits its turn and a reader never sees half a
file; a later apply of the same output dir starts a new state, without them.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from gpuplan.after.finished_run import FinishedRun
from gpuplan.lifecycle.run_dir import STATE_FILE
from gpuplan.lifecycle.run_lock import RunLock
from gpuplan.lifecycle.state import write_json_atomic


def weights_step(run: FinishedRun) -> int | None:
    if run.checkpoint is not None:
        return run.checkpoint
    return (run.state.get("progress") or {}).get("global_step")


def entry(run: FinishedRun, data_files: list[str] | None, heldout: dict[str, Any] | None, tasks: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "step": weights_step(run),
        "checkpoint": run.checkpoint,
        "data": data_files or "the run's eval split",
        **(heldout or {}),
        "tasks": tasks or {},
    }


def record(run: FinishedRun, evaluation: dict[str, Any]) -> str:
    """Append `evaluation` to the state's "evaluations"; returns the state file's path."""
    path = os.path.join(run.output_dir, STATE_FILE)
    with RunLock(run.output_dir):
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        state.setdefault("evaluations", []).append(evaluation)
        write_json_atomic(path, state)
    return path
