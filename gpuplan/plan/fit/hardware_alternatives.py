"""What would fit when a plan does not: other GPUs, more GPUs, each computed by the planner.

Called by plan/build.py for a plan whose memory.fit fails. Every alternative printed is
a full plan of the user's spec with only the named lines changed, and it fits: nothing
is advised that the same model says would not fit. Two questions, in this order:

1. the smallest catalog GPU (by memory; then price) that fits at this GPU count;
2. the fewest GPUs of this type that fit (counts doubling up to MAX_GPUS, on as many
   nodes as the catalog's GPUs per node need), with the sharding the plan then chooses.

Method alternatives (LoRA/QLoRA) are added beside these by another function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuplan.hardware.catalog import load_catalog
from gpuplan.hardware.prices import catalog_price, split_count
from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.fit.fixes import NoFit
from gpuplan.plan.types import Diagnostic, Plan
from gpuplan.spec.load import table

MAX_GPUS = 64

PlanFn = Callable[[Mapping[str, Any]], "Plan | None"]


@dataclasses.dataclass(frozen=True)
class Alternative:
    """Other hardware the spec fits on, planned in full; plan/fit/fix_words.py alternative_line says it."""

    what: str  # "a larger GPU" | "more GPUs"
    values: tuple[tuple[str, Any], ...]  # the spec values to change, in the order said; None removes the key
    plan: Plan

    @property
    def changes(self) -> dict[str, Any]:
        return dict(self.values)


def _hardware_raw(raw: Mapping[str, Any], **values: Any) -> dict[str, Any]:
    return {**raw, "hardware": {**table(raw, "hardware"), **values}}


def larger_gpu(raw: Mapping[str, Any], gpu: GPUProfile, count: int, nodes: int, plan: PlanFn) -> Alternative | None:
    """The smallest catalog GPU other than `gpu` on which the spec fits at the same count."""
    hw = table(raw, "hardware")
    others = [g for g in load_catalog().values() if not g.is_cpu and g.name != gpu.name]
    price = {g.name: (c.usd_per_gpu_hour if (c := catalog_price(g.name)) else float("inf")) for g in others}
    for g in sorted(others, key=lambda g: (g.memory_bytes, price[g.name])):
        split = split_count(g.name, count * nodes)
        if split is None:
            continue
        per_node, n = split
        changes: dict[str, Any] = {"gpu": g.name, "count": per_node, "nodes": n}
        for key in ("memory_gib", "price_per_hour"):  # they describe the other GPU
            if hw.get(key) is not None:
                changes[key] = None
        p = plan(_hardware_raw(raw, **changes))
        if p is not None and p.memory.fits:
            values: list[tuple[str, Any]] = [("hardware.gpu", g.name)]
            values += [("hardware.count", per_node)] if per_node != hw.get("count", 1) else []
            values += [("hardware.nodes", n)] if n != hw.get("nodes", 1) else []
            values += [(f"hardware.{k}", None) for k in ("memory_gib", "price_per_hour") if k in changes]
            return Alternative("a larger GPU", tuple(values), p)
    return None


def more_gpus(raw: Mapping[str, Any], gpu: GPUProfile, count: int, nodes: int, plan: PlanFn) -> Alternative | None:
    """The fewest GPUs of `gpu`'s type on which the spec fits, with the plan's own sharding."""
    hw, dist = table(raw, "hardware"), table(raw, "distributed")
    total = count * nodes * 2
    while total <= MAX_GPUS:
        split = split_count(gpu.name, total)
        if split is not None:
            per_node, n = split
            candidate = _hardware_raw(raw, count=per_node, nodes=n)
            p = plan(candidate)
            extra: list[tuple[str, Any]] = []
            if (p is None or not p.memory.fits) and dist.get("strategy", "auto") != "auto":
                candidate = {**candidate, "distributed": {**dist, "strategy": "auto"}}
                p = plan(candidate)
                extra = [("distributed.strategy", "auto")]
            if p is not None and p.memory.fits:
                values: list[tuple[str, Any]] = [("hardware.count", per_node)]
                values += [("hardware.nodes", n)] if n != hw.get("nodes", 1) else []
                return Alternative(f"{total} x {gpu.name}", tuple(values + extra), p)
        total *= 2
    return None


def hardware_alternatives(raw: Mapping[str, Any], gpu: GPUProfile, count: int, nodes: int, plan: PlanFn) -> list[Alternative]:
    if gpu.is_cpu:
        return []
    return [a for a in (larger_gpu(raw, gpu, count, nodes, plan), more_gpus(raw, gpu, count, nodes, plan)) if a]


def with_hardware_alternatives(
    errors: Sequence[Diagnostic], nofit: NoFit, loaded, spec, gpu: GPUProfile, plan: PlanFn
) -> tuple[list[Diagnostic], tuple[Mapping[str, Any], ...]]:
    """`errors` with the no-fit error's fix naming the hardware that fits (or saying none does);
    the memory fit's own one-key fixes follow, without the hardware ones when the hardware
    above is planned in full. The error is the one the no-fit record made, whatever its method.
    Also the fix's options as data: the spec values of each alternative and one-key fix it names."""
    from gpuplan.plan.fit.fix_words import alternative_line, no_fit_fix

    out = list(errors)
    options: tuple[Mapping[str, Any], ...] = tuple(f.changes for f in nofit.fixes)
    for i, d in enumerate(out):
        if d == nofit.diagnostic:
            alts = hardware_alternatives(loaded.raw, gpu, spec.hardware.count, spec.hardware.nodes, plan)
            others = len(out) - 1  # the spec's other errors: every full plan of other hardware has them too
            if alts:
                found = "what fits (each planned in full):\n" + "\n".join(f"    {alternative_line(a)}" for a in alts)
            elif others:  # a full plan that fails says nothing of its memory: the search found nothing, not "none fits"
                errs, them = ("error", "it") if others == 1 else (f"{others} errors", "them")
                found = (
                    f"no other hardware could be planned in full with the spec's other {errs} (listed with this one) "
                    f"still in it; fix {them} and plan again to see the hardware that fits"
                )
            else:
                found = f"no catalog GPU fits at {spec.hardware.world_size} GPU(s), nor up to {MAX_GPUS} x {gpu.name}"
            # The memory fit's one-key hardware fixes are checked on memory alone; planned in full above,
            # none fitted, so they are dropped unless the other errors kept those full plans from running.
            drop = bool(alts) or not others
            rest = no_fit_fix(nofit.fixes, nofit.method_alternatives, drop_hardware=drop)
            out[i] = dataclasses.replace(d, fix=f"{found}\n  or: {rest}" if rest else found)
            options = tuple(a.changes for a in alts) + tuple(f.changes for f in nofit.shown_fixes(drop_hardware=drop))
            break
    return out, options
