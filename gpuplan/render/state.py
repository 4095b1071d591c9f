"""Text for the lifecycle: drift since the last apply, a run's state (gpuplan show), the end-of-run summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan.plan.methods import method_named
from gpuplan.plan.sections import MemorySection, ThroughputSection
from gpuplan.render.sparkline import sparkline
from gpuplan.render.text import render_plan, shown
from gpuplan.units import gib


def render_drift(drift: Mapping[str, Any] | None, output_dir: str) -> list[str]:
    if drift is None:
        return [f"No apply recorded in {output_dir}: everything above is new."]
    when = drift.get("finished_at") or drift.get("started_at")
    head = f"Since the last apply in {output_dir} ({drift.get('status')}, {when}):"
    if not drift["changes"]:
        return [head, "  no changes."]
    return [head] + [f"  ~ {c['key']} = {shown(c['before'])} -> {shown(c['after'])}" for c in drift["changes"]]


def render_finished(done: Any, output_dir: str, checkpoint: str | None) -> list[str]:
    """A completed run that the plan asks no more of (lifecycle/drift.py Finished): what apply says
    instead of training, and how to train more (`checkpoint`: the one a longer plan resumes from)."""
    changed = ", ".join(d.key for d in done.changes)
    if not done.changes:
        head = f"No changes: the run in {output_dir} completed step {done.step} with this same plan."
    else:
        head = (
            f"No steps to train: the run in {output_dir} completed step {done.step} and this plan trains to step "
            f"{done.asks_for}; what changed ({changed}) takes effect only in a new run."
        )
    return [
        head,
        "Apply complete: nothing trained, nothing written.",
        f"  to train more, raise training.max_steps above {done.step} (or training.num_train_epochs) and apply again: "
        + (f"it resumes from {checkpoint}" if checkpoint else "the run kept no checkpoint, so it trains from the start"),
        "  to train a new run, set another output.dir, or apply with --restart (the old checkpoints are moved aside)",
    ]


def job_lines(job: Mapping[str, Any] | None, remote: Mapping[str, Any] | None) -> list[str]:
    """A handed-off run: its job (lifecycle/state.py record_submission) and what the engine says of it now."""
    if not job:
        return []
    lines = [f"  {job.get('target')} job {job.get('id')}, submitted {job.get('submitted_at')}; its files in {job.get('job_dir')}"]
    if remote:
        detail = f"; {remote['detail']}" if remote.get("detail") else ""
        lines.append(f"  remote job: {remote.get('state')} ({remote.get('source')}{detail})")
    return lines


def render_run_state(
    path: str,
    state: Mapping[str, Any],
    losses: Sequence[float] = (),
    rewards: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    samples: Sequence[Mapping[str, Any]] = (),
) -> str:
    """A run's gpuplan-state.json as text: status, progress, measured against planned, then its plan.

    `losses` (the logged training losses, metrics.jsonl) add a one-line sparkline of the loss;
    `rewards` (dpo / kto: TRL's rewards/margins and rewards/accuracies by step) one line each;
    `samples` (its [eval] sample_prompts lines) the last generation of each prompt."""
    p, r = state.get("progress", {}), state.get("results", {}) or {}
    plan = state["plan"]
    lines = [
        f"Run in {path}: {state.get('status')}",
        f"  started {state.get('started_at') or '-'}, finished {state.get('finished_at') or '-'}",
        f"  step {p.get('global_step')} of {p.get('max_steps') or '?'}, {p.get('samples_seen')} samples seen",
    ]
    lines += job_lines(state.get("job"), state.get("remote_job"))
    if state.get("error"):
        lines.append(f"  error: {state['error']}")
    for o in state.get("oom_replans") or []:
        lines.append(
            f"  out of memory at step {o['step']}: per-device batch {o['from']['batch']} -> "
            f"{o['to']['batch']} x {o['to']['accumulation']} accumulation (same effective batch)"
        )
    measured = r.get("peak_allocated_bytes") or r.get("peak_rss_bytes")
    if measured:
        planned_bytes = MemorySection.from_dict(plan.get("memory") or {}).allocated_peak_bytes
        lines.append(f"  peak memory {gib(measured)} measured, {gib(planned_bytes)} planned")
    lines += measured_time_lines(r, ThroughputSection.from_dict(plan.get("throughput") or {}))
    if r.get("train_loss_first") is not None:
        lines.append(f"  loss {r['train_loss_first']:.4f} -> {r.get('train_loss_last'):.4f}")
    if len(losses) > 1:
        lines.append(f"  loss {sparkline(losses)} {min(losses):.4f}..{max(losses):.4f} over {len(losses)} logged steps")
    for name in ("margins", "accuracies"):
        values = [v for _, v in (rewards or {}).get(name, ())]
        if len(values) > 1:
            lines.append(f"  reward {name} {sparkline(values)} {values[0]:.3f} -> {values[-1]:.3f}")
    lines += evaluation_lines(state.get("evaluations") or [])
    last = {s.get("prompt"): s for s in samples}  # the newest generation of each prompt
    lines += [f"  sample at step {s.get('step')}: {s.get('prompt')!r} -> {s.get('completion')!r}" for s in last.values()]
    return "\n".join(lines) + "\n\n" + render_plan(plan)


def measured_time_lines(r: Mapping[str, Any], t: ThroughputSection) -> list[str]:
    """Plan vs measured: the steady tokens/s and step time (after the first step), the start-up
    (apply's start to the first step's end, less one steady step) and the final save."""
    planned, steady = t.tokens_per_second, r.get("steady_tokens_per_second")
    if not steady:  # a run of one step, or a state written before the steady rate was kept
        if not r.get("tokens_per_second"):
            return []
        return [f"  {r['tokens_per_second']:,.0f} tokens/s measured" + (f", {planned:,.0f} planned" if planned else "")]
    lines = [
        f"  tokens/s: {steady:,.0f} measured (steady, after the first step), "
        + (f"{planned:,.0f} planned{_ratio(steady, planned)}" if planned else "no plan estimate")
        + (f"; whole loop {r['tokens_per_second']:,.0f}" if r.get("tokens_per_second") else "")
    ]
    if r.get("steady_step_time_s"):
        lines.append(
            f"  step time: {r['steady_step_time_s']:.3g} s measured, "
            + (f"{t.step_time_s:.3g} s planned" if t.step_time_s else "no plan estimate")
        )
    if r.get("startup_s") is not None:
        cal = t.calibration or {}
        plan_startup = cal.get("startup_s")
        lines.append(
            f"  start-up: {r['startup_s']:.3g} s measured (to the end of the first step)"
            + (f", final save {r['finish_s']:.3g} s" if r.get("finish_s") is not None else "")
            + (
                f"; planned {plan_startup:.3g} s for both (the calibration's)"
                if plan_startup is not None
                else "; the plan had no measured start-up (it counts steps only)"
            )
        )
    if r.get("runtime_s") is not None:
        lines.append(
            f"  run time: {r['runtime_s']:.3g} s measured" + (f", {t.run_time_s:.3g} s planned" if t.run_time_s is not None else "")
        )
    return lines


def evaluation_lines(evaluations: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per `gpuplan eval` recorded in the state (after/record.py), oldest first."""
    out = []
    for e in evaluations:
        parts = []
        if e.get("eval_loss") is not None:
            parts.append(
                f"held-out loss {e['eval_loss']:.4f}" + (f", perplexity {e['perplexity']:.4f}" if e.get("perplexity") is not None else "")
            )
        for task, metrics in (e.get("tasks") or {}).items():
            parts.append(
                task + " " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "examples" and isinstance(v, (int, float)))
            )
        data = e.get("data")
        where = data if isinstance(data, str) else ", ".join(data or [])
        out.append(f"  eval at step {e.get('step')} ({e.get('at')}, {where}): " + "; ".join(parts))
    return out


def _ratio(measured: float | None, planned: float | None) -> str:
    if measured is None or not planned:
        return ""
    return f" ({measured / planned:.2f}x the plan)"


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The end-of-run summary: measured peak memory and throughput against the plan."""
    planned_mem = results.get("plan_allocated_peak_bytes")
    if "peak_allocated_bytes" in results:
        measured = results["peak_allocated_bytes"]
        mem = (
            f"peak memory: {gib(measured, 2, 'unknown')} allocated, {gib(results['peak_reserved_bytes'], 2, 'unknown')} reserved"
            f" (CUDA); plan {gib(planned_mem, 2, 'unknown')} allocated{_ratio(measured, planned_mem)}"
        )
    else:
        measured = results.get("peak_rss_bytes")
        mem = (
            f"peak memory: {gib(measured, 2, 'unknown')} process RSS (CPU: includes the interpreter and data);"
            f" plan {gib(planned_mem, 2, 'unknown')} allocated"
        )
    tps, planned_tps = results.get("tokens_per_second"), results.get("plan_tokens_per_second")
    thr = "throughput: " + (f"{tps:,.0f} tokens/s" if tps else "unknown")
    thr += f"; plan {planned_tps:,.0f} tokens/s{_ratio(tps, planned_tps)}" if planned_tps else "; plan: no estimate"
    first, last = results.get("train_loss_first"), results.get("train_loss_last")
    start, step = results.get("start_step") or 0, results["global_step"]
    span = f"over {step} steps" if not start else f"over steps {start + 1}-{step} (resumed at step {start})"
    loss = f"loss: {first:.4f} -> {last:.4f} {span}" if first is not None and last is not None else "loss: not logged"
    if results.get("eval_loss_last") is not None:
        loss += f"; eval loss {results['eval_loss_last']:.4f}"
    out = [mem, thr, loss]
    if method_named(results.get("method")).frozen_base:
        planned = results.get("plan_trainable_params")
        out.append(
            f"trainable: {results['trainable_params']:,} parameters ({results['method']} adapters"
            + (f"; plan {planned:,})" if planned is not None else ")")
        )
        out.append(
            f"final adapter: {results['final_model_dir']} (adapter_model.safetensors, "
            "adapter_config.json; load with peft PeftModel.from_pretrained)"
        )
        if results.get("merged_model_dir"):
            out.append(f"merged model: {results['merged_model_dir']}")
    else:
        out.append(f"final model: {results['final_model_dir']}")
    cal = results.get("calibration")
    if cal:
        out.append(
            f"calibration: {cal['utilisation']:.1%} of peak (MFU {cal['mfu']:.1%}) measured; later plans on "
            f"{cal['count'] * cal['nodes']} x {cal['gpu']} use it"
            + (f" (recorded in {results['calibration_store']})" if results.get("calibration_store") else "")
        )
    return out
