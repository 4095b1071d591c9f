"""Text for the lifecycle: drift since the last apply and a run's state (gpuplan show)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuplan.render.sparkline import sparkline

from gpuplan.render.text import gib, render_plan, toml_value


def render_drift(drift: Mapping[str, Any] | None, output_dir: str) -> list[str]:
    if drift is None:
        return [f"No apply recorded in {output_dir}: everything above is new."]
    when = drift.get("finished_at") or drift.get("started_at")
    head = f"Since the last apply in {output_dir} ({drift.get('status')}, {when}):"
    if not drift["changes"]:
        return [head, "  no changes."]
    return [head] + [f"  ~ {c['key']} = {toml_value(c['before'])} -> {toml_value(c['after'])}" for c in drift["changes"]]


def render_run_state(path: str, state: Mapping[str, Any], losses: Sequence[float] = ()) -> str:
    """A run's gpuplan-state.json as text: status, progress, measured against planned, then its plan.

    `losses` (the logged training losses, metrics.jsonl) add a one-line sparkline of the loss."""
    p, r = state.get("progress", {}), state.get("results", {}) or {}
    plan = state["plan"]
    lines = [f"Run in {path}: {state.get('status')}",
             f"  started {state.get('started_at')}, finished {state.get('finished_at') or '-'}",
             f"  step {p.get('global_step')} of {p.get('max_steps') or '?'}, {p.get('samples_seen')} samples seen"]
    if state.get("error"):
        lines.append(f"  error: {state['error']}")
    for o in state.get("oom_replans") or []:
        lines.append(f"  out of memory at step {o['step']}: per-device batch {o['from']['batch']} -> "
                     f"{o['to']['batch']} x {o['to']['accumulation']} accumulation (same effective batch)")
    measured = r.get("peak_allocated_bytes") or r.get("peak_rss_bytes")
    if measured:
        lines.append(f"  peak memory {gib(measured)} measured, {gib(plan['memory'].get('allocated_peak_bytes'))} planned")
    if r.get("tokens_per_second"):
        planned = plan.get("throughput", {}).get("tokens_per_second")
        lines.append(f"  {r['tokens_per_second']:,.0f} tokens/s measured" + (f", {planned:,.0f} planned" if planned else ""))
    if r.get("train_loss_first") is not None:
        lines.append(f"  loss {r['train_loss_first']:.4f} -> {r.get('train_loss_last'):.4f}")
    if len(losses) > 1:
        lines.append(f"  loss {sparkline(losses)} {min(losses):.4f}..{max(losses):.4f} over {len(losses)} logged steps")
    return "\n".join(lines) + "\n\n" + render_plan(plan)
