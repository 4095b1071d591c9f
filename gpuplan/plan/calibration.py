"""Measured efficiency replaces the published default (DESIGN: time is an estimate with a source).

Every completed `apply` records what it measured (apply/calibrate.py) as one line of the
calibration store (userfiles.py). A plan on the same hardware (same catalog entry, same
GPUs per node and nodes) takes its utilisation from the measured run closest to it in
FLOPs per token, and says which run that was:

    utilisation = measured utilisation x default(this model) / default(measured model)

For the spec that was measured the ratio is 1: the plan's step time is the measured
one. For another spec the measured run's efficiency carries over through FLOPs per
token (the step time scales with this spec's FLOPs), corrected by how the published
default efficiency changes between the two model sizes (plan/efficiency.py). Pure.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.efficiency import default_efficiency


def matching_runs(records: Sequence[Mapping[str, Any]], gpu: str, count: int, nodes: int) -> list[Mapping[str, Any]]:
    return [r for r in records
            if r.get("gpu") == gpu and r.get("count") == count and r.get("nodes", 1) == nodes
            and isinstance(r.get("utilisation"), (int, float)) and 0 < r["utilisation"] <= 1
            and r.get("flops_per_token")]


def calibrated_efficiency(records: Sequence[Mapping[str, Any]], gpu: GPUProfile, count: int, nodes: int,
                          *, n_params: int, flops_per_token: int) -> tuple[float, dict[str, Any]] | None:
    """(utilisation, the `throughput.calibration` section) from the closest measured run, or None."""
    runs = matching_runs(records, gpu.name, count, nodes)
    if not runs:
        return None
    # nearest in log FLOPs per token; among equals the most recent (records are in order)
    best = min(enumerate(runs), key=lambda ir: (abs(math.log(flops_per_token / ir[1]["flops_per_token"])), -ir[0]))[1]
    measured = float(best["utilisation"])
    here, _ = default_efficiency(gpu, n_params)
    there, _ = default_efficiency(gpu, int(best.get("n_params") or n_params))
    scale = here / there if there else 1.0
    util = min(1.0, measured * scale)
    section = {
        "run": best.get("run"),
        "finished_at": best.get("finished_at"),
        "spec_path": best.get("spec_path"),
        "measured": {k: best.get(k) for k in ("tokens_per_second", "step_time_s", "mfu", "utilisation",
                                               "flops_per_token", "n_params", "peak_memory_bytes")},
        "same_flops_per_token": best["flops_per_token"] == flops_per_token,
        "size_scale": scale,
        "utilisation": util,
        "runs_on_this_hardware": len(runs),
    }
    return util, section


def calibration_assumption(section: Mapping[str, Any], dtype: str) -> str:
    m = section["measured"]
    how = ("this spec's FLOPs per token" if section["same_flops_per_token"]
           else f"scaled to this spec by FLOPs per token x {section['size_scale']:.2f} for model size")
    return (f"{section['utilisation']:.1%} of peak dense {dtype} TFLOP/s, calibrated: measured "
            f"{m['utilisation']:.1%} ({m['tokens_per_second']:,.0f} tokens/s) in {section['run']}; {how}")
