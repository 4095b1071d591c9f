"""The run directory (output.dir): the names of what apply writes there and later commands read.

One place for them, torch-free, so apply/ (the writer), after/, render/ and cli/ (the readers)
cannot drift apart:

    output.dir/
      gpuplan-state.json         the applied plan and what the run measured (lifecycle/state.py)
      .gpuplan.lock              one apply at a time (lifecycle/run_lock.py)
      gpuplan-launch-plan.json   the plan every rank of a multi-process run executes (apply/launch/)
      metrics.jsonl              one JSON object per logged step, sample or event (apply/train/metrics.py)
      checkpoint-N/              the Trainer's checkpoints (transformers.trainer_utils.PREFIX_CHECKPOINT_DIR)
      final/                     the trained model, or the adapters (apply/model/final.py)
      final/merged/              the adapters merged into the base (output.merge_adapter)
      tune/, tune-results.json   `gpuplan tune`'s candidate runs and what each measured (apply/train/tune.py)
"""

from __future__ import annotations

STATE_FILE = "gpuplan-state.json"
LOCK_FILE = ".gpuplan.lock"
LAUNCH_PLAN_FILE = "gpuplan-launch-plan.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_PREFIX = "checkpoint-"
FINAL_DIR = "final"
MERGED_DIR = "merged"  # inside FINAL_DIR
TUNE_DIR = "tune"
TUNE_RESULTS_FILE = "tune-results.json"


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step}"


def checkpoint_step(name: str) -> int | None:
    """N for a directory named checkpoint-N, else None."""
    rest = name[len(CHECKPOINT_PREFIX) :] if name.startswith(CHECKPOINT_PREFIX) else ""
    return int(rest) if rest.isdigit() else None
