"""Advice that follows from the step-time terms: when fixed costs dominate, amortise them.

Kernel launches are paid per micro-batch whatever its size, the Trainer's costs per
optimizer step: more tokens per micro-batch spread them. A fix is named only when it
works: a larger per-device batch only if the same memory model (plan/fit/search.py) fits it,
and the share it would leave is computed by the same step-time model; packing (more
real tokens in each micro-batch of padded documents) when the spec turned it off and the
plan would keep it on if set (`packable`: not for DPO / KTO, which TRL pads, nor seq-cls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.types import Diagnostic

DOMINANT = 0.4  # fixed costs at or above this share of the step are named
TARGET = 0.25  # the share a suggested batch should bring them under


def fixed_share(step_time: Mapping[str, Any] | None) -> float:
    return float(((step_time or {}).get("shares") or {}).get("fixed costs", 0.0))


def fixed_costs_advice(
    step_time: Mapping[str, Any] | None,
    wl: Workload,
    *,
    user_batch: int | None,
    user_accumulation: int | None,
    samples_per_device: int,
    packing: Any,
    packable: bool,
    fits: Callable[[int], bool],
    share_at: Callable[[Workload], float],
) -> Diagnostic | None:
    """`fits(batch)`: whether that per-device batch fits (same memory model); `share_at(wl)`:
    the fixed-cost share the step-time model gives for another workload; `packable`: whether
    the plan keeps `data.packing = true` on for this spec (plan/rules/chat_data.py packing_holds)."""
    share = fixed_share(step_time)
    if share < DOMINANT:
        return None
    b, s = wl.per_device_batch, wl.seq_len
    summary = (
        f"fixed costs (kernel launches, checkpointing's and the Trainer's own work) are {share:.0%} of the step: "
        f"each micro-batch of {b} x {s} tokens is too small to amortise them"
    )
    fix = None
    if user_batch is not None:
        best: tuple[float, int] | None = None
        for cand in range(b + 1, samples_per_device + 1):
            if samples_per_device % cand or not fits(cand):
                continue
            after = share_at(dataclasses.replace(wl, per_device_batch=cand, gradient_accumulation_steps=samples_per_device // cand))
            if best is None or after < best[0]:
                best = (after, cand)
            if after < TARGET:
                break
        if best is not None and best[0] < share - 0.1:  # only a batch that really helps is named
            after, cand = best
            acc = f", training.gradient_accumulation_steps = {samples_per_device // cand}" if user_accumulation is not None else ""
            fix = f"training.per_device_train_batch_size = {cand}{acc} (fits; fixed costs then {after:.0%} of the step)"
    if fix is None and packing is False and packable and wl.task == "causal-lm":
        fix = "data.packing = true: full seq_len blocks put more real tokens in each micro-batch"
    detail = (
        None
        if fix
        else (
            "no larger per-device batch that fits brings them down: launches are paid per "
            "micro-batch, so only more work per launch (longer sequences, a larger model) "
            "amortises them"
        )
    )
    return Diagnostic("note", "training.per_device_train_batch_size", summary, detail=detail, fix=fix)
