"""Out of memory during apply: re-plan with the next smaller per-device batch.

The effective batch is held: per-device batch b' divides the per-device samples per
optimizer step (b x accumulation), and accumulation becomes samples / b'. Each batch is
tried at most once and only smaller ones are tried, so the retries end (at batch 1 at
the latest). Also holds the test-only OOM injection (GPUPLAN_TEST_INJECT_OOM).
"""

from __future__ import annotations

import os
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.types import Plan
from gpuplan.units import gib

BATCH = "training.per_device_train_batch_size"
ACCUM = "training.gradient_accumulation_steps"
INJECT_ENV = "GPUPLAN_TEST_INJECT_OOM"  # tests only: "STEP:MAX_BATCH"


def next_smaller_batch(plan: Plan) -> tuple[int, int] | None:
    """(batch, accumulation) one rung down with the same samples per step, or None at batch 1."""
    t = plan.resolved.training
    b, acc = t.per_device_train_batch_size, t.gradient_accumulation_steps
    samples = b * acc
    for d in range(b - 1, 0, -1):
        if samples % d == 0:
            return d, samples // d
    return None


def with_batch(plan: Plan, batch: int, accumulation: int, why: str) -> Plan:
    """The plan with a new per-device batch and accumulation, each marked as re-planned."""
    return plan.adjusted({BATCH: batch, ACCUM: accumulation}, reason=why, rule="apply.oom_replan")


def estimate_error(plan: Plan) -> dict[str, Any]:
    """How far the memory estimate was off, at least: the plan put the peak at X < C, the
    device's capacity; an OOM means the real peak passed C, so X was low by (C - X) / X or more."""
    est = plan.memory.allocated_peak_bytes
    cap = plan.memory.capacity_bytes or plan.hardware.memory_bytes
    low = (cap - est) / est if est and cap and cap > est else None
    return {"estimated_allocated_bytes": est, "capacity_bytes": cap, "estimate_low_by_at_least": low}


def describe(record: dict[str, Any]) -> str:
    low = record.get("estimate_low_by_at_least")
    off = f"; the estimate was at least {low:.0%} low" if low is not None else ""
    return (
        f"out of memory at step {record['step']} with per-device batch {record['from']['batch']}: "
        f"the plan estimated {gib(record['estimated_allocated_bytes'], 2, 'unknown')} of {gib(record['capacity_bytes'], 2, 'unknown')}"
        f"{off}. Re-planned to per-device batch {record['to']['batch']} x {record['to']['accumulation']} "
        "accumulation steps (same effective batch)"
    )


class OOMRetry(Exception):
    """Train again with `plan` (a smaller per-device batch, same effective batch)."""

    def __init__(self, plan: Plan, record: dict[str, Any], message: str):
        self.plan, self.record, self.message = plan, record, message
        super().__init__(message)


def replan_after_oom(plan: Plan, step: int, error: BaseException) -> Exception:
    """The OOMRetry to raise after `error` at `step`, or an ApplyError when no smaller batch is left
    (or several processes run: the other ranks wait inside a collective, no rank may retry alone)."""
    t = plan.resolved.training
    b, acc = t.per_device_train_batch_size, t.gradient_accumulation_steps
    smaller = next_smaller_batch(plan) if int(os.environ.get("WORLD_SIZE", "1")) == 1 else None
    err = estimate_error(plan)
    if smaller is None:
        low = err["estimate_low_by_at_least"]
        return ApplyError(
            f"out of memory at step {step} at per-device batch {b} (plan estimate "
            f"{gib(err['estimated_allocated_bytes'], 2, 'unknown')} allocated peak of {gib(err['capacity_bytes'], 2, 'unknown')}"
            + (f"; the estimate was at least {low:.0%} low" if low is not None else "")
            + "). Set training.gradient_checkpointing = true, a smaller data.seq_len, or more GPUs"
        )
    record = {
        "step": step,
        "from": {"batch": b, "accumulation": acc},
        "to": {"batch": smaller[0], "accumulation": smaller[1]},
        "error": f"{type(error).__name__}: {error}"[:500],
        **err,
    }
    why = f"re-planned after running out of memory at per-device batch {b} (step {step})"
    return OOMRetry(with_batch(plan, smaller[0], smaller[1], why), record, describe(record))


def injected_oom_callback() -> Any | None:
    """Tests only: raise torch.OutOfMemoryError at every step >= STEP while the per-device
    batch exceeds MAX_BATCH, so the re-plan path runs on a CPU. None unless the env var is set."""
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return None
    step, max_batch = (int(x) for x in spec.split(":"))
    import torch
    from transformers import TrainerCallback

    class InjectOOM(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step >= step and args.per_device_train_batch_size > max_batch:
                raise torch.OutOfMemoryError(f"{INJECT_ENV}: injected at step {state.global_step}")

    return InjectOOM()
