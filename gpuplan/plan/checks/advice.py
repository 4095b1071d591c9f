"""Warnings about the plan as a whole, drawn from its resolved hardware and estimates.

- hardware.gpu = "auto" found no GPU: the plan is for this machine's CPU, which is
  rarely what a spec for a real model wants; say so and how to plan for a GPU.
- a run estimated at more than a week is almost always a wrong device or step count.
"""

from __future__ import annotations

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.sections import ThroughputSection
from gpuplan.plan.types import Diagnostic

WEEK_S = 7 * 24 * 3600


def auto_resolved_to_cpu(requested: str, gpu: GPUProfile) -> Diagnostic | None:
    if requested != "auto" or not gpu.is_cpu:
        return None
    return Diagnostic(
        "warning",
        "hardware.gpu",
        'hardware.gpu = "auto" resolved to "cpu": no GPU was detected on this machine, so this plan is for its CPU',
        detail="gpuplan plans for any GPU without having it; the memory and time figures of this plan are the CPU's",
        fix='to plan for a GPU, set hardware.gpu = "A100-80GB" (any name from `gpuplan gpus`) or pass --gpu A100-80GB to `gpuplan plan`',
    )


def long_run(throughput: ThroughputSection, on_cpu: bool) -> Diagnostic | None:
    run_s, step_s = throughput.run_time_s, throughput.step_time_s
    if run_s is None or run_s <= WEEK_S or not step_s:
        return None
    days = run_s / 86400
    steps_in_a_week = max(1, int(WEEK_S // step_s))
    device = (
        'set hardware.gpu = "H100-80GB" (or pass --gpu H100-80GB)'
        if on_cpu
        else "raise hardware.count, or plan for a faster GPU (`gpuplan gpus`)"
    )
    return Diagnostic(
        "warning",
        "training.max_steps",
        f"the run is estimated at {days:,.1f} days ({throughput.max_steps or 0:,} steps at ~{step_s:,.2f} s/step), more than a week",
        fix=f"{device}, or set training.max_steps = {steps_in_a_week} or fewer to finish within a week",
    )
