"""One spec planned on many GPUs and GPU counts: fits, settings, memory, time and cost.

The same planner as `gpuplan plan` (plan/build.py), called once per row. Its fixed
costs are paid once per process: imports, the catalog (cached in hardware/catalog.py),
the spec file (read once here), the schema (built at import) and the rule order
(cached in plan/engine/graph.py). Pure: no torch, no files but the spec and its model config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuplan.hardware.catalog import load_catalog
from gpuplan.hardware.prices import split_count
from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.build import assemble, resolve, with_overrides
from gpuplan.plan.fit.savers import set_by_spec
from gpuplan.plan.inputs.environment import EnvironmentLike
from gpuplan.plan.precision_label import precision_label
from gpuplan.plan.rules.common import FIT_SOLUTION
from gpuplan.plan.types import Plan, PlanError
from gpuplan.spec.load import LoadedSpec, table

DEFAULT_COUNTS = (1, 2, 4, 8)


def default_gpus() -> list[str]:
    return [n for n, g in load_catalog().items() if not g.is_cpu]


def _row_overrides(raw: Mapping[str, Any], gpu: str, per_node: int, nodes: int) -> dict[str, Any]:
    hw = table(raw, "hardware")
    values: dict[str, Any] = {"gpu": gpu, "count": per_node, "nodes": nodes}
    if hw.get("gpu") != gpu:  # a memory or price override describes the spec's own GPU
        values.update(memory_gib=None, price_per_hour=None)
    return with_overrides(raw, {"hardware": values})


def compare_row(
    loaded: LoadedSpec,
    gpu: str,
    total: int,
    *,
    environment: EnvironmentLike,
    detect: Callable[[], GPUProfile] | None = None,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    split = split_count(gpu, total)
    if split is None:
        return {"gpu": gpu, "count": total, "nodes": None, "fits": False, "error": f"{total} GPUs do not fill whole nodes of this GPU"}
    row, _ = plan_row(loaded, gpu, *split, environment=environment, detect=detect, prices=prices, calibrations=calibrations)
    return row


def plan_row(
    loaded: LoadedSpec,
    gpu: str,
    per_node: int,
    nodes: int,
    *,
    environment: EnvironmentLike,
    detect: Callable[[], GPUProfile] | None = None,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Any], Plan | None]:
    """(compare's row, the Plan) of the spec on `nodes` x `per_node` GPUs `gpu`; the Plan is None where it does not fit."""
    row: dict[str, Any] = {"gpu": gpu, "count": per_node * nodes, "nodes": nodes, "fits": False, "error": None, "gpus_per_node": per_node}
    one = dataclasses.replace(loaded, raw=_row_overrides(loaded.raw, gpu, per_node, nodes))
    try:
        spec, settings, profile, facts, ctx = resolve(one, detect=detect, environment=environment)
    except PlanError as e:
        return {**row, "error": e.diagnostics[0].summary}, None
    sol = ctx.internal.get(FIT_SOLUTION)
    if ctx.has_errors:
        first = next(d for d in ctx.diagnostics if d.severity == "error")
        needs = sol.smallest_bytes if sol is not None and not sol.fits else None
        return {**row, "error": None if needs else first.summary, "needs_bytes": needs, "capacity_bytes": profile.memory_bytes}, None
    plan = assemble(one, spec, settings, profile, facts, ctx, environment=environment, prices=prices, calibrations=calibrations)
    return {**row, **fit_cells(plan, profile, per_node * nodes)}, plan


def fit_cells(plan: Plan, profile: GPUProfile, total: int) -> dict[str, Any]:
    """A fitting row's settings, memory, time and cost, read from its plan."""
    s, mem, t = plan.settings, plan.memory, plan.throughput
    precision = precision_label(s, profile.bf16 or profile.is_cpu)
    return {
        "fits": True,
        "per_device_train_batch_size": s["training.per_device_train_batch_size"].value,
        "gradient_accumulation_steps": s["training.gradient_accumulation_steps"].value,
        "precision": precision,
        "warnings": [d.summary for d in plan.diagnostics if d.severity == "warning"],
        "weight_dtype": s["model.dtype"].value,
        "optim": s["training.optim"].value,
        "gradient_checkpointing": s["training.gradient_checkpointing"].value,
        "savers": [x.name for x in mem.savers],  # the ones the fit search turned on
        "spec_savers": [n for n in set_by_spec(s) if n not in {x.name for x in mem.savers}],  # the spec's own
        "sharding": mem.layout,
        "host_ram_per_node_bytes": (mem.host or {}).get("peak_bytes"),  # plan/estimate/memory/host.py
        "allocated_peak_bytes": mem.allocated_peak_bytes,
        "reserved_peak_bytes": mem.reserved_peak_bytes,
        "capacity_bytes": mem.capacity_bytes,
        "step_time_s": t.step_time_s,
        "run_time_s": t.run_time_s,
        "tokens_per_second": t.tokens_per_second,
        "utilisation": t.utilisation,
        "bound_by": (t.step_time or {}).get("bound_by"),  # the step-time model's largest term
        "step_shares": (t.step_time or {}).get("shares"),
        "calibrated": t.calibration is not None,
        "price_per_gpu_hour": t.price_per_gpu_hour,
        "price_source": t.price_source,
        "cost_usd": t.cost_usd,
        "time_interval": t.time_interval,  # low/high step time, run time and cost (plan/estimate/interval.py)
        **hourly_cost(t.price_per_gpu_hour, total, t.step_time_s),
    }


def hourly_cost(price_per_gpu_hour: float | None, gpus: int, step_time_s: float | None) -> dict[str, float | None]:
    """What a row costs per hour (all its GPUs) and per optimizer step: known from the price alone,
    when the run's length is not (no training.max_steps). Every row trains the spec's effective
    batch, so the same steps: the cost per step ranks them as the whole run's cost would."""
    if price_per_gpu_hour is None:
        return {"price_per_hour_usd": None, "cost_per_step_usd": None}
    per_hour = price_per_gpu_hour * gpus
    return {"price_per_hour_usd": per_hour, "cost_per_step_usd": per_hour * step_time_s / 3600 if step_time_s else None}


# Two rows whose ranked figure (cost or time) differs by less than this are a near tie: the
# model cannot tell them apart (its held-out error is ~10%: benchmarks/RESULTS.md), so the one
# whose interval ends lower (the smaller worst case) ranks first.
NEAR_TIE = 0.05


def _ranked(r: Mapping[str, Any], by: str) -> tuple[tuple, float | None, float | None, int]:
    """(sort key, the ranked figure, its interval's high end, the figure's kind) of a fitting row:
    by cost the kind is 0 run cost, 1 cost per step, 2 none; by time 0."""
    inf = float("inf")
    iv = r.get("time_interval") or {}
    high = iv.get("high_factor")
    if r.get("cost_usd") is not None:
        cost: tuple = (0, r["cost_usd"])
    elif r.get("cost_per_step_usd") is not None:
        cost = (1, r["cost_per_step_usd"])
    else:
        cost = (2, 0.0)
    time = r.get("run_time_s") if r.get("run_time_s") is not None else (r.get("step_time_s") or inf)
    if by == "cost" and cost[0] < 2:
        figure = cost[1]
    else:
        figure = time if time != inf else None
    first = (cost, time) if by == "cost" else (time, cost)
    kind = cost[0] if by == "cost" else 0
    return first, figure, (figure * high if figure is not None and high else figure), kind


def sort_rows(rows: list[dict[str, Any]], by: str = "cost") -> list[dict[str, Any]]:
    """Fitting rows first, by cost (unknown cost after known, then by time) or by time. Without a
    run time (no max_steps) the cost is the cost per step: price x GPUs x step time. Near ties
    (NEAR_TIE) go by the high end of the rows' intervals: the smaller worst case first."""

    def key(r: Mapping[str, Any]) -> tuple:
        return (not r["fits"], *_ranked(r, by)[0], r["gpu"], r["count"])

    ordered = sorted(rows, key=key)
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(ordered):  # runs of near-tied fitting rows, each re-ordered by its interval's high end
        head = ordered[i]
        j = i + 1
        if head["fits"]:
            _, figure, _, kind = _ranked(head, by)
            while j < len(ordered) and ordered[j]["fits"]:
                _, f2, _, k2 = _ranked(ordered[j], by)
                if figure is None or f2 is None or k2 != kind or f2 > figure * (1 + NEAR_TIE):
                    break
                j += 1
        run = ordered[i:j]
        if len(run) > 1:
            run = sorted(run, key=lambda r: (_ranked(r, by)[2], key(r)))
        out += run
        i = j
    return out


def compare(
    loaded: LoadedSpec,
    *,
    gpus: Sequence[str] | None = None,
    counts: Sequence[int] = DEFAULT_COUNTS,
    sort: str = "cost",
    environment: EnvironmentLike,
    detect: Callable[[], GPUProfile] | None = None,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every (gpu, count) row, sorted; the cheapest (or fastest) fit first and marked `best`."""
    rows = [
        compare_row(loaded, g, c, environment=environment, detect=detect, prices=prices, calibrations=calibrations)
        for g in (gpus or default_gpus())
        for c in counts
    ]
    rows = sort_rows(rows, sort)
    for i, r in enumerate(rows):
        r["best"] = i == 0 and r["fits"]
    return rows
