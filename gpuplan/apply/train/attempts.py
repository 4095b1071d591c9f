"""The training attempts of one apply: the resume check, the out-of-memory retry loop, and what
a finished attempt measured. apply/train/execute.py's execute() drives them.

An attempt builds the Trainer from the plan, trains, and after running out of memory is
replaced by one with a smaller per-device batch that resumes from the newest checkpoint
(apply/train/oom.py re-plans it with the same memory model the plan used).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuplan.apply.errors import ApplyError
from gpuplan.lifecycle.state import RunState
from gpuplan.plan.types import Plan

if TYPE_CHECKING:
    from gpuplan.apply.train.execute import Prepared


def check_resume_point(resume_from: str, output_dir: str) -> None:
    """Refuse a directory that is not a complete Trainer checkpoint; trim metrics.jsonl back to its step."""
    from gpuplan.apply.train.checkpoints import checkpoint_problem, checkpoint_step, restore_metrics, trim_metrics

    if not os.path.isfile(os.path.join(resume_from, "trainer_state.json")):
        raise ApplyError(f"cannot resume from {resume_from}: no trainer_state.json in it (not a Trainer checkpoint)")
    if problem := checkpoint_problem(resume_from):
        raise ApplyError(
            f"cannot resume from {resume_from}: {problem}",
            fix=f"rerun with --restart, or delete {resume_from} to resume from the one before",
        )
    if int(os.environ.get("RANK", "0")) == 0:  # rank 0 owns metrics.jsonl
        restore_metrics(output_dir, resume_from)  # a bucket run's: the copy saved with the checkpoint, when further on
        trim_metrics(output_dir, checkpoint_step(resume_from))


@dataclass
class Attempt:
    """The one reference to the live Trainer and model of the training attempt running now."""

    prepared: Prepared | None = None


def train_within_memory(
    plan: Plan,
    attempt: Attempt,
    *,
    build: Callable[[Plan, str | None], Prepared],
    stop: Any,
    state: RunState,
    device: str,
    resume_from: str | None,
    echo: Callable[[str], None],
) -> tuple[Plan, Any]:
    """Train; after running out of memory, re-plan to a smaller per-device batch (oom.py) and resume.

    One pass, plus one per re-plan; each goes to a smaller batch, so the loop ends.
    Returns the plan that trained and the Trainer's output; `attempt` holds its Trainer.
    """
    from gpuplan.apply.train.checkpoints import checkpoint_step, find_resumable, trim_metrics
    from gpuplan.apply.train.oom import OOMRetry

    output_dir = plan.resolved.output.dir
    while True:
        attempt.prepared = build(plan, resume_from)
        retry = None
        try:
            with stop:
                return plan, _train(attempt.prepared.trainer, plan, resume_from)
        except OOMRetry as e:  # leave the except block first: its traceback holds the model
            retry = (e.plan, e.record, e.message)
        attempt.prepared.metrics.close()
        attempt.prepared = None  # the last reference to the model: now it can be freed
        _release(device)
        plan = retry[0]
        resume_from = find_resumable(output_dir, on_bucket=plan.resolved.launch.on_bucket)[0]  # this run's newest complete checkpoint
        trim_metrics(output_dir, checkpoint_step(resume_from) if resume_from else 0)  # one process here
        state.replanned(plan, {**retry[1], "resumed_from": resume_from})
        echo(retry[2] + (f"; resuming from {resume_from}" if resume_from else "; starting over"))


def run_results(plan: Plan, prepared: Prepared, output: Any, started: float) -> dict[str, Any]:
    """What the run measured, beside what the plan predicted."""
    trainer, metrics = prepared.trainer, prepared.metrics
    step = trainer.state.global_step
    now = time.perf_counter()
    return {
        "global_step": step,
        # tokens the ranks really consumed, all-gathered by the Trainer (multi-process runs; convert.py)
        "input_tokens_seen": trainer.state.num_input_tokens_seen or None,
        "start_step": metrics.start_step,  # > 0 when resumed from a checkpoint
        "samples_seen": step * prepared.samples_per_step,
        "tokens_per_step": metrics.tokens_per_step,
        "tokens_per_second": metrics.tokens_per_second(step),
        "steady_tokens_per_second": metrics.steady_tokens_per_second(),
        "time_to_first_step_s": metrics.time_to_first_step_s,
        # the run time as start-up + steps x steady step + finish (apply/train/calibrate.py records the three)
        "steady_step_time_s": metrics.steady_step_time_s(),
        "startup_s": metrics.startup_s(),
        "finish_s": now - metrics.last_step_end if metrics.last_step_end is not None else None,  # the final save
        "train_loss_first": metrics.first_loss,
        "train_loss_last": metrics.last_loss,
        "train_loss_mean": output.training_loss,
        "eval_loss_last": metrics.last_eval_loss,
        "runtime_s": now - started,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "plan_allocated_peak_bytes": plan.memory.allocated_peak_bytes,
        "plan_tokens_per_second": plan.throughput.tokens_per_second,
        "per_device_train_batch_size": plan.resolved.training.per_device_train_batch_size,
        "gradient_accumulation_steps": plan.resolved.training.gradient_accumulation_steps,
    }


def _train(trainer: Any, plan: Plan, resume_from: str | None) -> Any:
    import torch

    from gpuplan.apply.train.oom import replan_after_oom

    try:
        return trainer.train(resume_from_checkpoint=resume_from)
    except torch.OutOfMemoryError as e:
        raise replan_after_oom(plan, trainer.state.global_step, e) from e


def _release(device: str) -> None:
    """Free the memory of an attempt that ran out of it. The caller drops its last reference
    to the Trainer and model first: while any name binds them, nothing here can free them."""
    import gc

    gc.collect()  # the model, optimizer and Trainer reference each other: only the collector frees them
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
