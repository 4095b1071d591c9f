"""`gpuplan tune SPEC`: time the fit search's top candidates here, write the fastest into the spec.

The candidates come from the plan side (plan/tune.py), the experiments from apply's own
training loop (apply/train/tune.py). Bounded by --budget (seconds of this command; a candidate whose
planned short run would pass it is skipped, and the table says so), resumable (the results
file in the spec's output.dir is reused for a candidate measured with the same settings,
hardware and packages), and the spec is edited in place with tomlkit: its comments and
layout stay, each key tune sets carries the reason as its comment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuplan.cli.common import detect_hardware, user_files, write_atomic
from gpuplan.errors import GpuplanError, UserError


def check_args(args) -> None:
    if not args.budget > 0:
        raise UserError(f"--budget {args.budget:g}: the budget is seconds of timing, more than 0", fix="e.g. --budget 300")
    if args.steps < 2:
        raise UserError(
            f"--steps {args.steps}: a candidate needs 2 steps or more (the first is warm-up; the steady rate is of the others)",
            fix="e.g. --steps 4",
        )
    if args.top < 1:
        raise UserError(f"--top {args.top}: time at least one candidate", fix="e.g. --top 4")
    path = Path(args.spec)
    if path.suffix != ".toml":
        raise UserError(
            f"{path}: tune edits a spec file (.toml), not {path.suffix or 'a file without a suffix'}",
            fix="give the spec: gpuplan tune SPEC.toml",
        )


def cmd_tune(args) -> int:
    check_args(args)
    from gpuplan.plan.build import plan_spec, with_overrides
    from gpuplan.plan.inputs.environment import local_environment
    from gpuplan.plan.tune import tune_candidates
    from gpuplan.spec.load import load_toml

    loaded = load_toml(args.spec)
    prices, calibrations = user_files()
    environment = local_environment()
    base, candidates, dropped = tune_candidates(
        loaded, detect=detect_hardware, environment=environment, prices=prices, calibrations=calibrations, top=args.top
    )
    if not candidates:
        raise UserError(f"{args.spec}: no candidate to time (" + "; ".join(dropped or ["none fits"]) + ")")
    from gpuplan.apply.launch.backends import InProcess, launcher_for

    if not isinstance(launcher_for(base, args.spec, None, {}), InProcess):
        raise UserError(
            f"{args.spec}: tune times candidates in one process; this plan runs {base.world_size} processes",
            fix="tune a copy of the spec with hardware.count = 1, then set the count back",
        )
    from gpuplan.apply.launch.device import check_device

    check_device(base)  # a plan for other hardware than this machine's: apply's own refusal, before anything runs
    from gpuplan.apply.train.tune import planned_numbers, read_results, result_key, short_run, time_candidate, write_results
    from gpuplan.lifecycle.run_dir import TUNE_DIR
    from gpuplan.lifecycle.run_lock import RunLock

    out = Path(base.resolved.output.dir)
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    startup_seen: float | None = None
    with RunLock(str(out)):
        results = read_results(out)
        for i, c in enumerate(candidates):
            key = result_key(c.fingerprint, args.steps)
            row = {"label": c.label, "settings": dict(c.settings), "fingerprint": c.fingerprint, "planned": planned_numbers(c.plan)}
            if key in results and "measured" in results[key]:
                rows.append({**row, "measured": results[key]["measured"], "status": "reused (measured by an earlier tune)"})
                continue
            # the short run's time: its steps as planned, and the start-up measured here (by the last
            # candidate, or by the calibration's run of this model), else none known
            startup = startup_seen if startup_seen is not None else (c.plan.throughput.calibration or {}).get("startup_s")
            planned_s = (c.plan.throughput.step_time_s or 0.0) * args.steps + (startup or 0.0)
            elapsed = time.monotonic() - started
            if elapsed + planned_s > args.budget:
                rows.append(
                    {**row, "status": f"skipped: its ~{planned_s:.0f} s would pass the budget ({elapsed:.0f} of {args.budget:g} s used)"}
                )
                continue
            print(f"timing {i + 1}/{len(candidates)}: {c.label} ({args.steps} steps)", flush=True)
            run_dir = out / TUNE_DIR / c.fingerprint

            def replan(overrides: Mapping[str, Mapping[str, Any]]):
                raw = with_overrides(loaded.raw, overrides)
                return plan_spec(
                    dataclasses.replace(loaded, raw=raw), detect=detect_hardware, environment=environment, calibrations=calibrations
                )

            try:
                measured = time_candidate(short_run(c.plan, c.settings, replan, args.steps, run_dir), print)
            except GpuplanError as e:  # this candidate cannot run here (its plan or apply refuses it): the others still can
                rows.append({**row, "status": f"failed: {e.diagnostics[0].summary}"})
                continue
            if measured.get("startup_s") is not None:
                startup_seen = measured["startup_s"]
            results[key] = {"label": c.label, "settings": dict(c.settings), "measured": measured}
            write_results(out, results)  # after each candidate: an interrupted tune resumes from here
            rows.append({**row, "measured": measured, "status": "measured"})
    for line in table(rows, base):
        print(line)
    for d in dropped:
        print(f"  not timed: {d}")
    ranked = [r for r in rows if r.get("measured") and not r["measured"].get("error") and r["measured"].get("steady_tokens_per_second")]
    if not ranked:
        raise UserError(
            f"no candidate measured within --budget {args.budget:g} s", fix=f"give it more time: gpuplan tune {args.spec} --budget SECONDS"
        )
    best = max(ranked, key=lambda r: r["measured"]["steady_tokens_per_second"])
    print(write_best(args, loaded, base, best, ranked))
    return 0


def _ratio(measured: float | None, planned: float | None) -> str:
    return f"{measured / planned:.2f}x" if measured and planned else "-"


def table(rows: list[dict[str, Any]], base) -> list[str]:
    """One line per candidate: planned vs measured steady tokens/s and step time."""
    head = f"{'candidate':<48} {'planned tok/s':>13} {'measured tok/s':>14} {'ratio':>6} {'planned step':>12} {'measured step':>13}  status"
    lines = [
        f"Tune on {base.hardware.name} ({base.resolved.training.effective_batch_size} samples per step, same for every candidate):",
        head,
    ]
    for r in rows:
        p, m = r["planned"], r.get("measured") or {}
        tps = m.get("steady_tokens_per_second")
        step = m.get("steady_step_time_s")
        status = m.get("error") or r["status"]
        lines.append(
            f"{r['label']:<48} {p['tokens_per_second']:>13,.0f} {(f'{tps:,.0f}' if tps else '-'):>14} "
            f"{_ratio(tps, p['tokens_per_second']):>6} {p['step_time_s']:>11.3g}s {(f'{step:.3g}s' if step else '-'):>13}  {status}"
        )
    return lines


def write_best(args, loaded, base, best: Mapping[str, Any], ranked: Sequence[Mapping[str, Any]]) -> str:
    """Set the fastest candidate's keys in the spec (only those that differ from its plan now)."""
    import tomlkit

    from gpuplan.plan.build import plan_spec
    from gpuplan.plan.inputs.environment import local_environment
    from gpuplan.spec.load import LoadedSpec, parse_toml_text

    changes = {k: v for k, v in best["settings"].items() if base.value(k) != v}
    tps = best["measured"]["steady_tokens_per_second"]
    others = [r for r in ranked if r is not best]
    runner = max(others, key=lambda r: r["measured"]["steady_tokens_per_second"]) if others else None
    reason = f"{tps:,.0f} tokens/s measured, the fastest of {len(ranked)} timed by gpuplan tune" + (
        f" (next: {runner['label']}, {runner['measured']['steady_tokens_per_second']:,.0f})" if runner else ""
    )
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    if not changes:
        return f"Fastest: {best['label']}: {reason}. It is what the plan runs already: {args.spec} unchanged."
    if args.no_write:
        return f"Fastest: {best['label']}: {reason}. --no-write: {args.spec} unchanged; it would set " + ", ".join(
            f"{k} = {tomlkit.item(v).as_string()}" for k, v in changes.items()
        )
    path = Path(args.spec)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    doc = tomlkit.parse(text)
    for key, value in changes.items():
        section, name = key.split(".", 1)
        if section not in doc:
            doc[section] = tomlkit.table()
        item = tomlkit.item(value)
        item.comment(f"gpuplan tune {when}: {best['label']}, {tps:,.0f} tokens/s measured here")
        doc[section][name] = item
    new = tomlkit.dumps(doc)
    # the edited spec must plan, and plan the candidate, before it replaces the user's file
    edited = LoadedSpec(loaded.path, parse_toml_text(new, loaded.path), hashlib.sha256(new.encode()).hexdigest())
    plan = plan_spec(edited, detect=detect_hardware, environment=local_environment())
    wrong = [k for k, v in best["settings"].items() if plan.value(k) != v]
    if wrong:
        raise UserError(f"{path}: the edited spec plans other values for {', '.join(wrong)}; {path} unchanged")
    write_atomic(path, new)
    return (
        f"Fastest: {best['label']}: {reason}. Wrote "
        + ", ".join(f"{k} = {tomlkit.item(v).as_string()}" for k, v in changes.items())
        + f" into {path}."
    )
