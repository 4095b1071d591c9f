"""Human text drawn from the plan's JSON dict (DESIGN principle 7: they never drift).

A `+`/`~` line per change with its reason, the memory table against the GPU's
capacity, the throughput estimate, then a one-line summary.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpuplan.render.style import PLAIN, Style

GIB = 1024**3
SYMBOL = {"add": "+", "change": "~"}
COLOUR = {"add": "green", "change": "yellow"}
SEVERITY_COLOUR = {"error": "red", "warning": "yellow", "note": "cyan"}


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if v is None:
        return "(unset)"
    return str(v)


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def render_changes(changes: Sequence[Mapping[str, Any]], style: Style = PLAIN) -> list[str]:
    lines = []
    for c in changes:
        sym = style(SYMBOL[c["action"]], COLOUR[c["action"]], "bold")
        if c["action"] == "change":
            value = f"{toml_value(c['before'])} -> {toml_value(c['after'])}"
        else:
            value = toml_value(c["after"])
        lines.append(f"  {sym} {c['key']} = {value}")
        lines.append(style(f"      {c['reason']} [{c['rule']}]", "dim"))
    return lines


def render_memory(memory: Mapping[str, Any], hardware: Mapping[str, Any], style: Style = PLAIN) -> list[str]:
    comps = memory.get("components", {})
    name = hardware.get("name", "?")
    per = "per GPU" if hardware.get("vendor") != "cpu" else "host (CPU)"
    if memory.get("layout") not in (None, "single device"):
        per += f" under {memory['layout']}"
    lines = [style(f"Memory {per} ({memory.get('method', 'analytic')} estimate) on {name} with {gib(memory.get('capacity_bytes'))}:", "bold")]
    for k, v in comps.items():
        lines.append(f"  {k:<18} {gib(v):>10}")
    lines.append(f"  {'allocated peak':<18} {gib(memory.get('allocated_peak_bytes')):>10}   torch.cuda.max_memory_allocated")
    fits = memory.get("fits")
    verdict = style("fits", "green") if fits else style("does not fit", "red")
    total = "nvidia-smi" if hardware.get("vendor") != "cpu" else "process"
    lines.append(
        f"  {'device total':<18} {gib(memory.get('reserved_peak_bytes')):>10}   {total}; {verdict} in "
        f"{gib(memory.get('usable_bytes'))} usable ({memory.get('headroom', 0):.0%} headroom)"
    )
    if memory.get("host_bytes"):
        lines.append(f"  {'host RAM (offload)':<18} {gib(memory['host_bytes']):>10}   per GPU, outside the device figures")
    traced = memory.get("traced")
    if traced:
        lines.append(f"  {'traced peak':<18} {gib(traced['allocated_peak_bytes']):>10}   two real steps under FakeTensorMode; "
                     f"the estimate is {traced['analytic_minus_traced_fraction']:+.1%} off it")
        for n in traced.get("notes", []):
            lines.append(style(f"  {n if n.startswith('trace') else 'trace: ' + n}", "dim"))
    for s in memory.get("savers", []):
        lines.append(f"  saver: {s['name']} saves {gib(s['saved_bytes'])} ({s['cost']})")
    for n in memory.get("notes", []):
        lines.append(style(f"  note: {n}", "dim"))
    return lines


def render_trainable(model: Mapping[str, Any]) -> list[str]:
    """lora/qlora: trainable parameters, in total and per target (peft's count)."""
    a = model.get("adapters")
    if not a:
        return []
    total = model["total_params"]
    lines = [f"  {model['method']}: {model['trainable_params']:,} of {total:,} parameters trainable "
             f"({model['trainable_params'] / total:.2%}), as peft's get_nb_trainable_parameters counts them"]
    for name, t in a["per_target"].items():
        lines.append(f"    {name:<18} {t['layers']:>4} layers {t['params']:>14,} adapter parameters")
    if a.get("saved_params"):
        lines.append(f"    {'modules_to_save':<18} {'':>4}        {a['saved_params']:>14,} parameters (trained copies)")
    return lines


def render_throughput(t: Mapping[str, Any]) -> list[str]:
    if not t:
        return []
    step = t.get("step_time_s")
    run = t.get("run_time_s")
    out = [f"Throughput: {t['tokens_per_step']:,} tokens/step, ~{step:.2f} s/step, ~{t['tokens_per_second']:,.0f} tokens/s"
           + (f", ~{_duration(run)} for {t['max_steps']:,} steps" if run is not None else "")]
    out.append(f"  assumption: {t['assumption']}")
    return out


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
    mem = data.get("memory", {})
    s = data.get("settings", {})

    def val(k):
        return s.get(k, {}).get("value")

    return (
        f"Plan: {adds} to add, {mods} to change. "
        f"batch {val('training.effective_batch_size')} = {val('training.per_device_train_batch_size')} x "
        f"{val('training.gradient_accumulation_steps')} x {data['hardware'].get('count', 1) * data['hardware'].get('nodes', 1)} GPU(s); "
        f"{gib(mem.get('reserved_peak_bytes'))} of {gib(mem.get('capacity_bytes'))}"
        + ("" if mem.get("fits") else " (does not fit)")
    )


def render_plan(data: Mapping[str, Any], style: Style = PLAIN) -> str:
    hw, model = data["hardware"], data.get("model", {})
    n = model.get("n_params")
    size = f"{n / 1e6:,.1f}M parameters" if n else "size unknown"
    head = (f"gpuplan plan: {data.get('spec_path')}\n"
            f"  {model.get('model_type', '?')} ({size}, {model.get('task')}) on "
            f"{hw.get('count', 1)} x {hw.get('name')}" + (f" x {hw['nodes']} nodes" if hw.get("nodes", 1) > 1 else ""))
    parts = [head] + render_trainable(model) + [""]
    if data.get("changes"):
        parts.append(style("Changes to the spec:", "bold"))
        parts.extend(render_changes(data["changes"], style))
    else:
        parts.append("No changes: the spec is already resolved.")
    parts.append("")
    parts.extend(render_memory(data.get("memory", {}), hw, style))
    parts.append("")
    parts.extend(render_throughput(data.get("throughput", {})))
    diags = [d for d in data.get("diagnostics", []) if d["severity"] != "error"]
    if diags:
        parts.append("")
        parts.extend(render_diagnostics(diags, style))
    parts.append("")
    parts.append(style(summary_line(data), "bold"))
    return "\n".join(parts) + "\n"
