"""Human text drawn from the plan's JSON dict (docs/design.md principle 7: they never drift).

The dict's sections are read through their typed form (gpuplan.plan.sections).

A `+`/`~` line per change with its reason, the memory table against the GPU's
capacity, the throughput estimate, then a one-line summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan.plan.sections import HardwareSection, MemorySection, ModelSection, ThroughputSection
from gpuplan.plan.wording import smi
from gpuplan.render.style import PLAIN, Style
from gpuplan.toml_value import toml_value
from gpuplan.units import gib

SYMBOL = {"add": "+", "change": "~"}
COLOUR = {"add": "green", "change": "yellow"}
SEVERITY_COLOUR = {"error": "red", "warning": "yellow", "note": "cyan"}


def shown(v: Any) -> str:
    """A value in a change line: as TOML writes it, "(unset)" for None."""
    return toml_value(v, none="(unset)")


def on_cpu(hardware: HardwareSection) -> bool:
    return hardware.is_cpu


def ranks(hardware: HardwareSection) -> str:
    """The processes a plan trains on, named for the device: "8 GPU(s)" or "1 CPU process"."""
    n = hardware.world_size
    if on_cpu(hardware):
        return f"{n} CPU process" + ("es" if n != 1 else "")
    return f"{n} GPU(s)"


def render_changes(changes: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> list[str]:
    lines = []
    for c in changes:
        sym = style(SYMBOL[c["action"]], COLOUR[c["action"]], "bold")
        if c["action"] == "change":
            value = f"{shown(c['before'])} -> {shown(c['after'])}"
        else:
            value = shown(c["after"])
        lines.append(f"  {sym} {c['key']} = {value}")
        lines.append(style(f"      {c['reason']} [{c['rule']}]", "dim"))
    return lines


def render_memory(memory: MemorySection, hardware: HardwareSection, style: Style = PLAIN) -> list[str]:
    name = hardware.name or "?"
    cpu = on_cpu(hardware)
    per = "per GPU" if not cpu else "per training process"
    if memory.layout not in (None, "single device"):
        per += f" under {memory.layout}"
    where = f"on {name} with {gib(memory.capacity_bytes)}" if not cpu else f"on the CPU with {gib(memory.capacity_bytes)} of RAM"
    lines = [style(f"Memory {per} ({memory.method or 'analytic'} estimate) {where}:", "bold")]
    for k, v in (memory.components or {}).items():
        lines.append(f"  {k:<18} {gib(v):>10}")
    peak_means = "torch.cuda.max_memory_allocated" if not cpu else "tensors alive at the peak"
    lines.append(f"  {'allocated peak':<18} {gib(memory.allocated_peak_bytes):>10}   {peak_means}")
    verdict = style("fits", "green") if memory.fits else style("does not fit", "red")
    total = smi(hardware.vendor) if not cpu else "tensors + allocator (the process RSS adds the interpreter)"
    lines.append(
        f"  {'device total' if not cpu else 'process total':<18} {gib(memory.reserved_peak_bytes):>10}   {total}; {verdict} in "
        f"{gib(memory.usable_bytes)} usable ({memory.headroom or 0:.0%} headroom)"
    )
    if memory.host_bytes:
        lines.append(f"  {'host RAM (offload)':<18} {gib(memory.host_bytes):>10}   per GPU, outside the device figures")
    host = memory.host
    if host and memory.host_ram_needed_bytes:
        lines.append(
            f"  {'host RAM per node':<18} {gib(host['peak_bytes']):>10}   loading {gib(host['loading_bytes'])} "
            f"({host['loading']}), offloaded {gib(host['offloaded_bytes'])} ({gib(host['pinned_bytes'])} pinned)"
        )
    traced = memory.traced
    if traced:
        lines.append(
            f"  {'traced peak':<18} {gib(traced['allocated_peak_bytes']):>10}   two real steps under FakeTensorMode; "
            f"the estimate is {traced['analytic_minus_traced_fraction']:+.1%} off it"
        )
        for n in traced.get("notes", []):
            lines.append(style(f"  {n if n.startswith('trace') else 'trace: ' + n}", "dim"))
    for s in memory.savers:
        lines.append(f"  saver: {s.name} saves {gib(s.saved_bytes)} ({s.cost})")
    for n in memory.notes:
        lines.append(style(f"  note: {n}", "dim"))
    return lines


def render_trainable(model: ModelSection) -> list[str]:
    """lora/qlora: trainable parameters, in total and per target (peft's count)."""
    a = model.adapters
    if not a:
        return []
    total, trainable = model.total_params, model.trainable_params
    assert total is not None and trainable is not None, "the plan sets both counts with adapters"
    lines = [
        f"  {model.method}: {trainable:,} of {total:,} parameters trainable "
        f"({trainable / total:.2%}), as peft's get_nb_trainable_parameters counts them"
    ]
    for name, t in a["per_target"].items():
        lines.append(f"    {name:<18} {t['layers']:>4} layers {t['params']:>14,} adapter parameters")
    if a.get("saved_params"):
        lines.append(f"    {'modules_to_save':<18} {'':>4}        {a['saved_params']:>14,} parameters (trained copies)")
    return lines


def render_throughput(t: ThroughputSection) -> list[str]:
    if t.empty:
        return []
    run = t.run_time_s
    iv = t.time_interval or {}
    step_range = f" ({iv['step_time_s'][0]:.2f}-{iv['step_time_s'][1]:.2f} s)" if iv.get("step_time_s") else ""
    run_range = f" ({_duration_range(*iv['run_time_s'])})" if iv.get("run_time_s") else ""
    out = [
        f"Throughput: {t.tokens_per_step:,} tokens/step, ~{t.step_time_s:.2f} s/step{step_range}, ~{t.tokens_per_second:,.0f} tokens/s"
        + (f", ~{_duration(run)}{run_range} for {t.max_steps:,} steps" if run is not None else "")
    ]
    if t.step_time:
        out.append(f"  step time by term: {t.step_time['summary']}; bound by {t.step_time['bound_by']}")
    out.append(f"  assumption: {t.assumption}")
    gen = [x for x in (t.step_time or {}).get("terms", []) if x["group"] == "generation"]
    if gen:  # grpo / rloo: the completions' generation (plan/estimate/step_time/generation.py)
        parts = ", ".join(f"{x['name'].removeprefix('generation ')} {x['exposed_s']:.2f} s" for x in gen)
        out.append(f"  generation: {sum(x['exposed_s'] for x in gen):.2f} s/step ({parts}; every completion at its maximum length)")
    for name, seconds in (t.saver_seconds or {}).items():
        out.append(f"  {name}: +{seconds:.3g} s/step (included)")
    if iv.get("low_factor"):
        out.append(f"  range: x{iv['low_factor']:.2f} to x{iv['high_factor']:.2f} of the time, the {iv['basis']}")
    if t.cost_usd is not None:
        cost_range = f" (${iv['cost_usd'][0]:,.2f}-${iv['cost_usd'][1]:,.2f})" if iv.get("cost_usd") else ""
        out.append(f"Cost: ~${t.cost_usd:,.2f}{cost_range} at ${t.price_per_gpu_hour:.2f} per GPU-hour ({t.price_source})")
    return out


def _duration_range(low: float, high: float) -> str:
    """'3.2-4.4 h': both ends in the unit `_duration` picks for the high end."""
    if high < 120:
        return f"{low:.0f}-{high:.0f} s"
    if high < 7200:
        return f"{low / 60:.0f}-{high / 60:.0f} min"
    return f"{low / 3600:.1f}-{high / 3600:.1f} h"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def render_diagnostics(diags: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> list[str]:
    lines = []
    for d in diags:
        label = style(d["severity"].capitalize(), SEVERITY_COLOUR[d["severity"]], "bold")
        lines.append(f"{label}: {d['summary']}")
        if d.get("detail"):
            lines.append(f"  {d['detail']}")
        if d.get("fix"):
            lines.append(f"  fix: {d['fix']}")
    return lines


def summary_line(data: Mapping[str, Any]) -> str:
    changes = data.get("changes", [])
    adds = sum(1 for c in changes if c["action"] == "add")
    mods = len(changes) - adds
    mem = MemorySection.from_dict(data.get("memory") or {})
    hw = HardwareSection.from_dict(data["hardware"])
    s = data.get("settings", {})

    def val(k):
        return s.get(k, {}).get("value")

    return (
        f"Plan: {adds} to add, {mods} to change. "
        f"batch {val('training.effective_batch_size')} = {val('training.per_device_train_batch_size')} x "
        f"{val('training.gradient_accumulation_steps')} x {ranks(hw)}; "
        f"{gib(mem.reserved_peak_bytes)} of {gib(mem.capacity_bytes)}" + ("" if mem.fits else " (does not fit)")
    )


def render_plan(data: Mapping[str, Any], style: Style = PLAIN) -> str:
    hw = HardwareSection.from_dict(data["hardware"])
    model = ModelSection.from_dict(data.get("model") or {})
    n = model.n_params
    size = f"{n / 1e6:,.1f}M parameters" if n else "size unknown"
    head = (
        f"gpuplan plan: {data.get('spec_path')}\n"
        f"  {model.model_type or '?'} ({size}, {model.task}) on "
        + (f"{hw.count} x {hw.name}" if not on_cpu(hw) else f"the CPU ({ranks(hw)})")
        + (f" x {hw.nodes} nodes" if hw.nodes > 1 else "")
    )
    parts = [head] + render_trainable(model) + [""]
    if data.get("changes"):
        parts.append(style("Changes to the spec:", "bold"))
        parts.extend(render_changes(data["changes"], style))
    else:
        parts.append("No changes: the spec is already resolved.")
    parts.append("")
    parts.extend(render_memory(MemorySection.from_dict(data.get("memory") or {}), hw, style))
    parts.append("")
    parts.extend(render_throughput(ThroughputSection.from_dict(data.get("throughput") or {})))
    diags = [d for d in data.get("diagnostics", []) if d["severity"] != "error"]
    if diags:
        parts.append("")
        parts.extend(render_diagnostics(diags, style))
    parts.append("")
    parts.append(style(summary_line(data), "bold"))
    return "\n".join(parts) + "\n"
