"""The words of a fix: spec lines from the fit search's records (plan/fit/fixes.py Fix, NoFit;
plan/fit/hardware_alternatives.py Alternative), which hold keys and values, never text.

A change set is said as its spec lines (`hardware.count = 2, hardware.nodes = 2`), a value of
None as the removal of its key (`remove hardware.memory_gib`), then the record's words after the
value and its reason in parentheses. Nothing here reads a record back from its words: init and the
hardware alternatives read the records (init/starter_fit.py, plan/build.py NoFitError).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuplan.toml_value import toml_value
from gpuplan.units import GIB, gib

if TYPE_CHECKING:
    from gpuplan.plan.fit.fixes import Fix
    from gpuplan.plan.fit.hardware_alternatives import Alternative

ONE_KEY_HEAD = "any one of these fits (checked with the same memory model): "


def spec_lines(values: Sequence[tuple[str, Any]]) -> list[str]:
    """Each (key, value) as the line that sets it; None removes the key."""
    return [f"remove {key}" if value is None else f"{key} = {toml_value(value)}" for key, value in values]


def fix_line(fix: Fix) -> str:
    """One fix as said: its spec lines, the words after the value, its reason in parentheses."""
    text = ", ".join(spec_lines(fix.values))
    if fix.qualifier:
        text += f" {fix.qualifier}"
    if fix.why:
        text += f" ({fix.why})"
    return text


def no_fit_fix(fixes: Sequence[Fix], method_alternatives: Sequence[str], *, drop_hardware: bool = False) -> str | None:
    """The no-fit error's fix: the fitting methods, then the one-key fixes (without the hardware
    ones when the caller lists the hardware that fits, each planned in full)."""
    names = [a.split(" ", 1)[0] for a in method_alternatives]  # each line starts with its method (method_alternatives.py)
    which = "the fitting method above" if len(names) == 1 else "one of the fitting methods above"
    parts = [f"add the lines of {which} ({' or '.join(names)})"] if names else []
    kept = [fix_line(f) for f in fixes if not (drop_hardware and f.hardware)]
    if kept:
        parts.append(ONE_KEY_HEAD + "; ".join(kept))
    return "; or ".join(parts) or None


def alternative_line(alt: Alternative) -> str:
    """Other hardware that fits, planned in full: what changes, and what the plan then is."""
    mem = alt.plan.memory
    t = alt.plan.resolved.training
    batch = f"batch {t.per_device_train_batch_size} x {t.gradient_accumulation_steps} x {alt.plan.hardware.world_size} GPU(s)"
    host = mem.host_ram_needed_bytes  # offload or a 4-bit base per rank: a requirement, said beside the GPUs
    return (
        f"{alt.what}: {'; '.join(spec_lines(alt.values))}  -> {gib(mem.reserved_peak_bytes)} of "
        f"{gib(mem.capacity_bytes, 0)} per GPU, {mem.layout}, {batch}"
        + (f", and {host / GIB:,.0f} GiB of host RAM per node" if host else "")
    )
