"""When full fine-tuning does not fit: which of lora and qlora would, priced by the same model.

Called by the memory.fit error (plan/rules/memory.py). Each method is solved exactly as the
plan would solve it with those lines added (same batch, savers and hardware; the [lora]
and [quantization] tables as the spec gives them, their defaults when absent), and listed
only when it fits, with its memory and the exact spec lines to add. A frozen fp32 base
is 4 bytes per weight: when lora fits only with 16-bit weights on a GPU with bf16, the
lines say so (model.dtype is the user's choice, so it is a suggestion, never a change).
"""

from __future__ import annotations

import dataclasses

from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.fit.host_memory import plan_host_memory
from gpuplan.plan.fit.search import FitProblem, solve
from gpuplan.plan.methods import ADAPTER_METHODS
from gpuplan.plan.rules.lora import adapters_for
from gpuplan.units import GIB


def _distributed_lines(ctx: Resolver, sh) -> list[str]:
    """The [distributed] lines a spec without strategy "auto" needs for the sharding the search chose."""
    if sh.engine not in ("fsdp", "deepspeed") or ctx.spec("distributed.strategy") == "auto":
        return []
    if sh.engine == "fsdp":
        return ['strategy = "fsdp"', f'fsdp_sharding = "{sh.fsdp_sharding}"', f"fsdp_cpu_offload = {str(sh.offload_params).lower()}"]
    return ['strategy = "deepspeed"', f"zero_stage = {sh.zero_stage}"]


def adapter_alternatives(ctx: Resolver, problem: FitProblem) -> list[str]:
    """One line per fitting method: memory and the lines to add under [model]."""
    out: list[str] = []
    for method in (m.name for m in ADAPTER_METHODS):
        adapters = adapters_for(method, ctx)
        if adapters is None:
            return out
        base = dataclasses.replace(problem.base, adapters=adapters)
        lines = [f'method = "{method}"']
        solved = dataclasses.replace(problem, base=base)
        sol = solve(solved)
        if not sol.fits and method == "lora" and base.weight_dtype == "float32" and ctx.gpu.bf16:
            solved = dataclasses.replace(problem, base=dataclasses.replace(base, weight_dtype="bfloat16"))
            sol = solve(solved)
            lines.append('dtype = "bfloat16"')
        if not sol.fits:
            continue
        savers = f", {', '.join(sol.savers)}" if sol.savers else ""
        sh = sol.knobs.sharding
        layout = f", {sh.label}" if sh.engine in ("fsdp", "deepspeed") else ""
        host = plan_host_memory(ctx, sol, problem=solved) if (sh.engine in ("fsdp", "deepspeed") or sol.estimate.host_bytes) else None
        if host and problem.host_limit_bytes is not None and host.peak > problem.host_limit_bytes:
            continue  # it would not fit the host RAM known (plan/fit/host_memory.py)
        host_txt = f"; host RAM {host.peak / GIB:.0f} GiB per node" if host and host.peak else ""
        dist = _distributed_lines(ctx, sh)
        out.append(
            f"{method} needs {sol.estimate.reserved_peak_bytes / GIB:.1f} GiB of "
            f"{problem.usable_bytes / GIB:.1f} usable (per-device batch {sol.per_device_batch}{savers}{layout}"
            f"{host_txt}): add under [model]: {'; '.join(lines)}" + (f"; under [distributed]: {'; '.join(dist)}" if dist else "")
        )
    return out
