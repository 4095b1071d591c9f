"""The plan's time and cost as a range: the step-time model's spread on sources it was not fitted to.

benchmarks/fit_step_time.py predicts each published source's runs with constants fitted
without that source (leave-one-source-out) and writes the 10th and 90th percentile of
log(plan tokens/s / measured) to step_time/spread.json, overall and by what bounds the
step (matmuls, fixed costs, communication, ...: a group with too few rows has none).
A planned speed v then stands for a measured one between v / exp(p90) and v / exp(p10)
for 80% of those runs, so a planned time t for one between t x exp(p10) and t x exp(p90).

Only the step-time model's own estimate carries the range: a calibrated plan (scaled by a
run measured on this hardware), a given utilisation and a CPU plan (constants checked on
this machine, not on the published GPU runs) carry none, and say so in `basis`.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

SPREAD = Path(__file__).resolve().parent / "step_time" / "spread.json"


@lru_cache(maxsize=1)
def spread() -> dict[str, Any]:
    return json.loads(SPREAD.read_text())


def factors(bound_by: str | None) -> tuple[float, float, str]:
    """(low, high) multipliers of a planned time, and where they come from."""
    s = spread()
    group = (s.get("by_bound") or {}).get(bound_by or "")
    src = group or s
    lo, hi = math.exp(src["log_error_p10"]), math.exp(src["log_error_p90"])
    what = f"steps bound by {bound_by}, {group['rows']} rows" if group else f"all {s['rows']} rows"
    return (
        lo,
        hi,
        f"10th-90th percentile of the step-time model's error on published runs of sources left out of its fit ({what}; "
        "benchmarks/fit_step_time.py, leave-one-source-out)",
    )


def time_interval(
    *,
    step_time_s: float | None,
    run_time_s: float | None,
    cost_usd: float | None,
    bound_by: str | None,
    modelled: bool,
    calibrated: bool,
    on_cpu: bool,
) -> dict[str, Any] | None:
    """The `throughput.time_interval` section: low/high step time, run time and cost; None without a step time."""
    if step_time_s is None:
        return None
    if not modelled or calibrated or on_cpu:
        why = (
            "calibrated from a run measured on this hardware"
            if calibrated
            else "a CPU plan (its constants are checked on this machine: benchmarks/time_accuracy.py)"
            if on_cpu
            else "a given utilisation, not the step-time model"
        )
        return {"low_factor": None, "high_factor": None, "basis": f"no interval: {why}"}
    lo, hi, basis = factors(bound_by)

    def pair(v: float | None) -> list[float] | None:
        return None if v is None else [v * lo, v * hi]

    return {
        "low_factor": lo,
        "high_factor": hi,
        "step_time_s": pair(step_time_s),
        "run_time_s": pair(run_time_s),
        "cost_usd": pair(cost_usd),
        "basis": basis,
    }
