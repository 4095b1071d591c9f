"""`gpuplan compare SPEC`: the spec planned on every catalog GPU and GPU count, as a table."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan.cli.common import UserError, user_files
from gpuplan.units import GIB


def _parse_counts(text: str | None) -> list[int]:
    if not text:
        from gpuplan.plan.compare import DEFAULT_COUNTS

        return list(DEFAULT_COUNTS)
    try:
        counts = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 or c > 4096 for c in counts):
        raise UserError(f"--counts {text!r}: give GPU counts separated by commas, e.g. --counts 1,2,4,8")
    return counts


def _parse_gpus(text: str | None) -> list[str] | None:
    if not text:
        return None
    from gpuplan.hardware.catalog import AmbiguousGPUError, UnknownGPUError, lookup

    out = []
    for name in (n.strip() for n in text.split(",")):
        if not name:
            continue
        try:
            out.append(lookup(name).name)
        except (UnknownGPUError, AmbiguousGPUError) as e:
            raise UserError(f"--gpus: {e}") from None
    if not out:
        raise UserError("--gpus: give catalog names separated by commas, e.g. --gpus A100-80GB,H100-80GB")
    return out


def cmd_compare(args) -> int:
    from gpuplan.plan.compare import compare
    from gpuplan.plan.inputs.environment import local_environment
    from gpuplan.render.json import dumps
    from gpuplan.spec.load import load_toml

    gpus, counts = _parse_gpus(args.gpus), _parse_counts(args.counts)
    loaded = load_toml(args.spec)
    prices, calibrations = user_files()
    rows = compare(
        loaded, gpus=gpus, counts=counts, sort=args.sort, environment=local_environment(), prices=prices, calibrations=calibrations
    )
    if args.json:
        sys.stdout.write(dumps({"spec_path": args.spec, "sort": args.sort, "rows": rows}))
    else:
        print("\n".join(render_compare(rows, args.spec, args.sort)))
    return 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _range(r: Mapping[str, Any], key: str) -> list[float] | None:
    """The row's low/high `key` (run_time_s, cost_usd) from its time interval (plan/estimate/interval.py)."""
    return ((r.get("time_interval") or {}).get(key)) or None


def _run_time(r: Mapping[str, Any]) -> str:
    run = r.get("run_time_s")
    span = _range(r, "run_time_s")
    if run is None or not span:
        return _duration(run)
    low, high = _duration(span[0]), _duration(span[1])
    unit = high.rsplit(" ", 1)[-1]
    if low.endswith(f" {unit}"):  # one unit for both ends: "3.0-5.6 h"
        low = low[: -len(unit) - 1]
    return f"{_duration(run)} ({low}-{high})"


def _cost(r: Mapping[str, Any]) -> str:
    """The run's cost (and its range); without a run time (no max_steps) the price per hour of the row's GPUs."""
    if r.get("cost_usd") is not None:
        if r["cost_usd"] < 0.005:
            return "<$0.01"
        span = _range(r, "cost_usd")
        return f"${r['cost_usd']:,.2f}" + (f" (${span[0]:,.2f}-{span[1]:,.2f})" if span else "")
    if r.get("price_per_hour_usd") is not None:
        return f"${r['price_per_hour_usd']:,.2f}/h"
    return "no price"


def _cells(r: Mapping[str, Any]) -> list[str]:
    gpus = f"{r['count']}" + (f" ({r['nodes']} nodes)" if (r.get("nodes") or 1) > 1 else "")
    mark = "*" if r.get("best") else " "
    if not r["fits"]:
        why = (
            f"needs {r['needs_bytes'] / GIB:.1f} GiB of {r['capacity_bytes'] / GIB:.0f}"
            if r.get("needs_bytes")
            else (r.get("error") or "does not plan")
        )
        return [mark, r["gpu"], gpus, "no", why, "", "", "", "", "", "", ""]
    batch = f"{r['per_device_train_batch_size']}x{r['gradient_accumulation_steps']}"
    from gpuplan.plan.fit.savers import SAVERS, short_name

    on = set(r.get("spec_savers") or []) | set(r["savers"])  # the spec's own and the ones the fit search added
    order = [s.name for s in SAVERS] + [n for n in r["savers"] if n not in {s.name for s in SAVERS}]
    savers = "+".join(short_name(n) for n in order if n in on) or "-"
    cost = _cost(r)
    t = r["step_time_s"]
    step = (f"{t * 1000:.1f} ms" if t < 0.1 else f"{t:.2f} s") + ("(c)" if r.get("calibrated") else "")
    return [
        mark,
        r["gpu"],
        gpus,
        "yes",
        batch,
        r["precision"],
        savers,
        r["sharding"],
        f"{r['reserved_peak_bytes'] / GIB:.1f}/{r['capacity_bytes'] / GIB:.0f}",
        step,
        _run_time(r),
        cost,
    ]


def render_compare(rows: Sequence[Mapping[str, Any]], spec: str, sort: str) -> list[str]:
    head = ["", "gpu", "GPUs", "fits", "batch", "precision", "savers", "sharding", "GiB/GPU", "step", "run time", "cost"]
    table = [head] + [_cells(r) for r in rows]
    sized = [t for t in table if t[3] != "no"]  # a non-fit row's reason spans the columns after "fits"
    widths = [max(len(t[i]) for t in (sized if i >= 4 else table)) for i in range(len(head))]
    right = {2, 8, 9, 10, 11}

    def line(cells: list[str]) -> str:
        if cells[3] == "no":  # the reason spans the settings columns
            return "  ".join([cells[0], cells[1].ljust(widths[1]), cells[2].rjust(widths[2]), cells[3].ljust(widths[3]), cells[4]]).rstrip()
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    fits = [r for r in rows if r["fits"]]
    out = [
        f"gpuplan compare: {spec} ({len(rows)} rows, {len(fits)} fit; sorted by {sort})",
        "",
        line(head),
        *(line(c) for c in table[1:]),
        "",
    ]
    best = next((r for r in rows if r.get("best")), None)
    run_known = any(r.get("run_time_s") is not None for r in fits)
    if best:
        out.append(_best_line(best, sort))
    else:
        out.append("Nothing fits: try more GPUs (--counts 16,32) or a smaller setup.")
    warned: dict[str, list[str]] = {}  # the plans' own warnings (emulated bf16, ...), once each, with their rows
    for r in fits:
        for w in r.get("warnings") or []:
            warned.setdefault(w, []).append(f"{r['count']} x {r['gpu']}")
    out += [f"warning ({', '.join(where)}): {w}" for w, where in warned.items()]
    out.append("batch: per-device x accumulation steps; GiB/GPU: nvidia-smi peak / capacity; step (c): calibrated from a measured run")
    if any(_range(r, "run_time_s") or _range(r, "cost_usd") for r in fits):
        from gpuplan.plan.compare import NEAR_TIE

        out.append(
            "run time and cost (low-high): the step-time model's 10th-90th percentile error on published runs of sources "
            f"left out of its fit (benchmarks/RESULTS.md); rows within {NEAR_TIE:.0%} rank by the high end"
        )
    from gpuplan.hardware.userfiles import prices_path, shown_path

    sources = f"catalog sources: gpuplan/hardware/catalog.toml; your prices: {shown_path(prices_path())}"
    if run_known or not fits:
        out.append(f"cost: run time x GPUs x on-demand price ({sources})")
    else:
        out.append(
            f"cost: $/h of the row's GPUs at the on-demand price ({sources}); the run time is unknown, so rows "
            "rank by cost per step (every row trains the same steps of the same effective batch)"
        )
    return out


# Without max_steps the Trainer counts the steps from the data at apply time; the plan has no step count.
NO_RUN_TIME = "the spec sets no training.max_steps (set it for the run time and the cost)"


def _best_line(best: Mapping[str, Any], sort: str) -> str:
    """The marked row in words: the cheapest (or fastest) fit with its run time and cost, or, without
    a run time, its step time, price per hour and cost per step (what the rows were ranked by)."""
    where = f"{best['count']} x {best['gpu']}"
    priced = best.get("cost_usd") is not None or best.get("price_per_hour_usd") is not None
    what = "fastest fit" if sort != "cost" else ("cheapest fit" if priced else "fastest fit (no fitting row has a price)")
    if best.get("run_time_s") is not None:
        return f"* {what}: {where}, ~{_run_time(best)}" + (f", ~{_cost(best)}" if best.get("cost_usd") is not None else "")
    line = f"* {what}: {where}, {_duration(best['step_time_s'])} per step"
    if best.get("price_per_hour_usd") is not None:
        line += f" at ${best['price_per_hour_usd']:,.2f}/h (~${best['cost_per_step_usd']:,.4f} per step)"
    return line + f"; run time unknown, so no total cost: {NO_RUN_TIME}"
