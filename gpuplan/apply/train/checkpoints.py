"""Checkpoints that count only once complete, and what to do with the ones that are not.

transformers writes checkpoint-N/ file by file with no fsync or rename, so a run killed
while saving leaves a directory that looks like a checkpoint but is not one. After the
Trainer has written everything (its `on_save` event fires after `_save_checkpoint`,
transformers trainer.py `_maybe_log_save_evaluate`), gpuplan fsyncs the files and writes
gpuplan-checkpoint.json naming each file and its size, through a temporary file, fsync
and rename. A checkpoint counts only with that marker and every file at its size.

On a cloud bucket mounted with write-back (launch.storage_bucket: SkyPilot's MOUNT_CACHED,
gpuplan/spec/buckets.py) the marker says less: rclone uploads each file once it is closed, in no set
order, so a VM that dies after a save can leave the marker in the bucket with a file missing or
short. There a checkpoint with a marker and a missing or short file is a save that did not finish
uploading, set aside like one killed while saving; on a disk the files changed after they were
complete, and a person must decide.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuplan.lifecycle.run_dir import CHECKPOINT_PREFIX, METRICS_FILE
from gpuplan.lifecycle.state import write_json_atomic

MARKER = "gpuplan-checkpoint.json"
METRICS_COPY = "gpuplan-metrics.jsonl"  # a bucket run's metrics.jsonl as it was at the save


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(ckpt_dir: str, step: int) -> None:
    """fsync every file of a finished checkpoint, then record it as complete."""
    files: dict[str, int] = {}
    for root, _, names in os.walk(ckpt_dir):
        for name in names:
            path = os.path.join(root, name)
            if name == MARKER or name.startswith(".gpuplan-state-"):
                continue
            _fsync(path)
            files[os.path.relpath(path, ckpt_dir)] = os.path.getsize(path)
    write_json_atomic(os.path.join(ckpt_dir, MARKER), {"step": step, "files": dict(sorted(files.items()))})
    _fsync(ckpt_dir)


def checkpoint_problem(ckpt_dir: str) -> str | None:
    """None when `ckpt_dir` is a complete checkpoint; otherwise what is wrong with it."""
    marker = os.path.join(ckpt_dir, MARKER)
    if not os.path.isfile(marker):
        return f"incomplete: no {MARKER} (the apply stopped while saving it)"
    try:
        with open(marker, encoding="utf-8") as f:
            files = json.load(f)["files"]
        items = list(files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"corrupt: {MARKER} is unreadable ({e})"
    for name, size in items:
        path = os.path.join(ckpt_dir, name)
        if not os.path.isfile(path):
            return f"corrupt: {name} is missing"
        if os.path.getsize(path) != size:
            return f"corrupt: {name} is {os.path.getsize(path)} bytes, {size} when saved"
    return None


def checkpoint_dirs(output_dir: str) -> list[tuple[int, str]]:
    """(step, dir) of every checkpoint-N directory, newest first."""
    out = []
    for d in Path(output_dir).glob(CHECKPOINT_PREFIX + "*"):
        step = d.name.removeprefix(CHECKPOINT_PREFIX)
        if step.isdigit() and d.is_dir():
            out.append((int(step), str(d)))
    return sorted(out, reverse=True)


def find_resumable(output_dir: str, *, on_bucket: bool = False) -> tuple[str | None, list[str], list[tuple[str, str]]]:
    """(newest complete checkpoint, incomplete ones newer than it, corrupt ones newer than it).

    Incomplete: the marker never got written (killed while saving); safe to set aside.
    Corrupt: the marker is there but the files changed since; a person must decide.
    on_bucket (output.dir on a write-back bucket mount): a marker with a missing or short file is a
    save whose upload did not finish, so it is incomplete too.
    """
    incomplete: list[str] = []
    corrupt: list[tuple[str, str]] = []
    for _, d in checkpoint_dirs(output_dir):
        problem = checkpoint_problem(d)
        if problem is None:
            return d, incomplete, corrupt
        if problem.startswith("incomplete") or (on_bucket and not_uploaded(problem)):
            incomplete.append(d)
        else:
            corrupt.append((d, problem))
    return None, incomplete, corrupt


def not_uploaded(problem: str) -> bool:
    """A checkpoint_problem that a write-back upload cut short leaves: a file missing, or short."""
    return problem.startswith("corrupt: ") and (problem.endswith(" is missing") or " bytes, " in problem)


def set_aside(dirs: list[str]) -> list[str]:
    """Rename incomplete checkpoints to incomplete-checkpoint-N-<time> (the Trainer's
    rotation globs checkpoint-*, so they can neither be resumed nor rotated away)."""
    stamp = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    moved = []
    for d in dirs:
        p = Path(d)
        dest = p.with_name(f"incomplete-{p.name}-{stamp}")
        p.rename(dest)
        moved.append(str(dest))
    return moved


def trim_metrics(output_dir: str, step: int) -> None:
    """Drop metrics.jsonl lines after `step`: a resumed run logs those steps again."""
    path = os.path.join(output_dir, METRICS_FILE)
    if not os.path.isfile(path):
        return
    keep = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                keep.append(line if line.endswith("\n") else line + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _steps_through(path: str, step: int) -> int:
    """How many of metrics.jsonl's records at or before `step` `path` holds (0 for no file)."""
    if not os.path.isfile(path):
        return 0
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            n += isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step
    return n


def restore_metrics(output_dir: str, ckpt_dir: str) -> bool:
    """Put back the checkpoint's copy of metrics.jsonl (METRICS_COPY, bucket runs) where it holds more of the
    steps up to the checkpoint than output.dir's file: on a write-back bucket that file, appended to at every
    step, reaches the bucket only once it stops changing, so after a VM died it can be far behind the checkpoint."""
    copy = os.path.join(ckpt_dir, METRICS_COPY)
    step = checkpoint_step(ckpt_dir)
    path = os.path.join(output_dir, METRICS_FILE)
    if _steps_through(copy, step) <= _steps_through(path, step):
        return False
    tmp = path + ".tmp"
    shutil.copyfile(copy, tmp)
    os.replace(tmp, path)
    return True


def checkpoint_step(ckpt_dir: str) -> int:
    return int(Path(ckpt_dir).name.removeprefix(CHECKPOINT_PREFIX))


def marker_callback(with_metrics: bool = False) -> Any:
    """A TrainerCallback writing the marker after each save (rank 0 only); `with_metrics` (a run on a bucket)
    first copies metrics.jsonl into the checkpoint, written once and so uploaded with it (restore_metrics)."""
    from transformers import TrainerCallback

    class CheckpointMarker(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if args.world_size > 1:  # every rank writes its own files (rng_state_N.pth): wait for all
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    dist.barrier()
            if state.is_world_process_zero:
                d = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}{state.global_step}")
                if os.path.isdir(d):
                    metrics = os.path.join(args.output_dir, METRICS_FILE)
                    if with_metrics and os.path.isfile(metrics):
                        shutil.copyfile(metrics, os.path.join(d, METRICS_COPY))
                    write_marker(d, state.global_step)

    return CheckpointMarker()
