"""gpuplan-state.json: the applied plan and what the run measured, written (RunState) and read
(load_state) here and nowhere else.

Written atomically (temp file in the same directory, fsync, os.replace) so a reader
never sees half a file, even when the run is killed mid-write. Shape (format 1):

    {format_version, plan: Plan.to_dict(), status: running|completed|failed|interrupted,
     started_at, finished_at (ISO 8601 UTC or null), error (message or null),
     resumed_from (checkpoint dir or null),
     oom_replans: [{step, from: {batch, accumulation}, to: {...}, error, estimated_allocated_bytes,
                    capacity_bytes, estimate_low_by_at_least, resumed_from}] (apply/train/oom.py),
     progress: {global_step, max_steps, samples_seen},
     results: {peak_allocated_bytes, peak_reserved_bytes (CUDA) | peak_rss_bytes (CPU),
               tokens_per_second, train_loss_first, train_loss_last, runtime_s,
               method, trainable_params (measured, as peft counts them), plan_trainable_params,
               final_model_dir, merged_model_dir (lora with output.merge_adapter, else null),
               base_files ({file: {size, sha256}} of a pretrained base, apply/model/base_files.py), ...},
     evaluations: [...] (appended by `gpuplan eval`, after/record.py; absent until then),
     job: {target, id, submitted_at, job_dir, files, command} (a [launch] hand-off, gpuplan/clusters/handoff.py;
          absent for a run started here)}

A handed-off plan's state is first written at submission, with status "submitted" and the job record
(record_submission); the job's own `gpuplan apply --in-job` keeps that record when it starts (RunState).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.fsutil import write_text_atomic
from gpuplan.lifecycle.run_dir import STATE_FILE
from gpuplan.plan.types import Plan

STATE_FORMAT_VERSION = 1


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_state(output_dir: str | Path) -> dict[str, Any] | None:
    """The last apply's state in output_dir; None if never applied; GpuplanError if corrupt."""
    path = Path(output_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(state, dict) or "plan" not in state or "settings" not in state["plan"]:
            raise ValueError("no plan in it")
        return state
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "output.dir",
                    f"{path} is corrupt ({e})",
                    fix=f"move {path} away to start over, or restore it from a backup; checkpoints in {output_dir} are untouched",
                )
            ]
        ) from None


def _job_record(output_dir: str) -> dict[str, Any] | None:
    try:
        return submitted_job(output_dir)
    except GpuplanError:  # a corrupt state is replaced by this run's, as before
        return None


def record_submission(plan: Plan, output_dir: str, job: dict[str, Any]) -> None:
    """The state of a plan handed off to a cluster: submitted, not yet started, with the engine's job id.

    A state the job already wrote (a resubmission of a run that trained) keeps its progress and
    results; only the plan, the status and the job record change."""
    path = os.path.join(output_dir, STATE_FILE)
    old = load_state(output_dir) or {}
    data = {
        "format_version": STATE_FORMAT_VERSION,
        "started_at": None,
        "finished_at": None,
        "error": None,
        "resumed_from": None,
        "oom_replans": [],
        "progress": {"global_step": 0, "max_steps": plan.resolved.training.max_steps, "samples_seen": 0},
        "results": {},
        **{k: v for k, v in old.items() if k in ("progress", "results", "evaluations")},
        "plan": plan.to_dict(),
        "status": "submitted",
        "job": dict(job),
    }
    write_json_atomic(path, data)


def submitted_job(output_dir: str | Path) -> dict[str, Any] | None:
    """The job record of the state in output_dir (a hand-off), or None."""
    state = load_state(output_dir)
    job = None if state is None else state.get("job")
    return job if isinstance(job, dict) else None


class RunState:
    """The state file of one run; every method rewrites the whole file atomically."""

    def __init__(self, plan: Plan, output_dir: str, resumed_from: str | None = None):
        self.path = os.path.join(output_dir, STATE_FILE)
        # Under torchrun every rank runs execute(); only rank 0 owns the file.
        self.enabled = int(os.environ.get("RANK", "0")) == 0
        max_steps = plan.resolved.training.max_steps
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
        if self.enabled and (job := _job_record(output_dir)) is not None:  # started by a hand-off: keep its record
            self.data["job"] = job
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
