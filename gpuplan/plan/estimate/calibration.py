"""Measured efficiency replaces the published default (docs/design.md: time is an estimate with a source).

Every completed `apply` records what it measured (apply/calibrate.py) as one line of the
calibration store (userfiles.py). A plan on the same hardware (same catalog entry, same
GPUs per node and nodes) takes its utilisation from the measured run closest to it in
FLOPs per token, and says which run that was:

    utilisation = measured utilisation x default(this model) / default(measured model)

For the spec that was measured the ratio is 1: the plan's step time is the measured
one. For another spec the measured run's efficiency carries over through FLOPs per
token (the step time scales with this spec's FLOPs), corrected by how the published
default efficiency changes between the two model sizes (plan/efficiency.py).

With runs of two or more different FLOPs per step on the hardware (and none of this
spec's FLOPs per token), a fixed per-step overhead is fitted too, by least squares:

    step time = overhead + FLOPs per step x seconds per FLOP

which a single efficiency cannot express: small models, on a CPU above all, spend most
of a step in framework overhead (benchmarks/RESULTS.md, "Time estimates (CPU)"). The
plan keeps dividing FLOPs by a utilisation: the fitted step time is turned into the
utilisation that gives it. Modelled slowdowns (cache emptying) are not separated in the
fit. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.estimate.efficiency import default_efficiency


def matching_runs(records: Sequence[Mapping[str, Any]], gpu: str, count: int, nodes: int) -> list[Mapping[str, Any]]:
    return [r for r in records
            if r.get("gpu") == gpu and r.get("count") == count and r.get("nodes", 1) == nodes
            and isinstance(r.get("utilisation"), (int, float)) and 0 < r["utilisation"] <= 1
            and r.get("flops_per_token")]


def fit_overhead(runs: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(overhead s, s per FLOP) fitted over runs of different FLOPs per step; None when impossible."""
    pts = [(r["flops_per_token"] * r["tokens_per_step"], r["step_time_s"]) for r in runs
           if r.get("tokens_per_step") and r.get("step_time_s")]
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    overhead = my - slope * mx
    if slope <= 0:
        return None
    if overhead < 0:  # no overhead to speak of: a line through the origin
        overhead, slope = 0.0, sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)
    return overhead, slope


def calibrated_efficiency(records: Sequence[Mapping[str, Any]], gpu: GPUProfile, count: int, nodes: int,
                          *, n_params: int, flops_per_token: int, tokens_per_step: int | None = None,
                          peak_tflops: float | None = None) -> tuple[float, dict[str, Any]] | None:
    """(utilisation, the `throughput.calibration` section) from the measured runs, or None.

    tokens_per_step and peak_tflops (this plan's) allow the overhead fit; without them
    only the closest run is used.
    """
    runs = matching_runs(records, gpu.name, count, nodes)
    if not runs:
        return None
    same = [r for r in runs if r["flops_per_token"] == flops_per_token]
    fit = fit_overhead(runs) if not same and tokens_per_step and peak_tflops else None
    if fit is not None and tokens_per_step and peak_tflops:
        overhead, per_flop = fit
        flops = flops_per_token * tokens_per_step
        step = overhead + flops * per_flop
        util = min(1.0, flops / (step * count * nodes * peak_tflops * 1e12))
        latest = runs[-1]
        return util, {
            "run": latest.get("run"), "finished_at": latest.get("finished_at"), "spec_path": latest.get("spec_path"),
            "measured": {k: latest.get(k) for k in ("tokens_per_second", "step_time_s", "mfu", "utilisation",
                                                     "flops_per_token", "n_params", "peak_memory_bytes")},
            "fit": {"overhead_s": overhead, "s_per_tflop": per_flop * 1e12, "runs": len(runs),
                    "from": [r.get("run") for r in runs]},
            "same_flops_per_token": False, "size_scale": None, "utilisation": util,
            "runs_on_this_hardware": len(runs),
        }
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
    if section.get("fit"):
        f = section["fit"]
        return (f"{section['utilisation']:.1%} of peak dense {dtype} TFLOP/s, calibrated: step time fitted over "
                f"{f['runs']} measured runs on this hardware = {f['overhead_s']:.3f} s overhead + "
                f"{f['s_per_tflop']:.3g} s per TFLOP (latest: {section['run']})")
    how = ("this spec's FLOPs per token" if section["same_flops_per_token"]
           else f"scaled to this spec by FLOPs per token x {section['size_scale']:.2f} for model size")
    return (f"{section['utilisation']:.1%} of peak dense {dtype} TFLOP/s, calibrated: measured "
            f"{m['utilisation']:.1%} ({m['tokens_per_second']:,.0f} tokens/s) in {section['run']}; {how}")
