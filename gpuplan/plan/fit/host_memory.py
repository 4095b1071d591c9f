"""The plan's host RAM per node (plan/estimate/memory/host.py) checked against hardware.host_memory_gib.

The RAM known: hardware.host_memory_gib, else this machine's RAM for a local plan only (another
machine's RAM is not this one's: plan/inputs/target.py is_local). It is checked when the plan keeps
states in host RAM (offload), when it shards adapters over a frozen base (QLoRA under FSDP loads
the 4-bit base into host RAM on every rank), or when the spec gives the RAM. Over 90% of it is
refused with the parts and what changes them: fewer ranks per node (the same GPUs on more
nodes: loading and offload are per rank), checked with the same arithmetic before it is printed.
"""

from __future__ import annotations

import math

from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.host import HostMemory, host_memory
from gpuplan.plan.fit.fix_words import fix_line
from gpuplan.plan.fit.fixes import Fix
from gpuplan.plan.fit.search import workload
from gpuplan.plan.inputs.target import is_local
from gpuplan.plan.rules.common import FIT_PROBLEM
from gpuplan.units import GIB

HOST_VERIFIED = "the host RAM per node recomputed with this change (estimate/memory/host.py)"
HOST_LIMIT = 0.9  # the OS, the page cache of the weights and the Python processes need the rest


def known_host_bytes(ctx: Resolver) -> int:
    """hardware.host_memory_gib, else this machine's RAM for a local plan; 0 when unknown."""
    given = ctx.spec("hardware.host_memory_gib")
    if given:
        return int(given * GIB)
    return int(ctx.environment.host_memory_bytes or 0) if is_local(ctx.spec) else 0


def host_limit(ctx: Resolver) -> int | None:
    """Usable host RAM per node for the fit search (offload candidates); None when unknown or on CPU."""
    have = known_host_bytes(ctx)
    return int(HOST_LIMIT * have) if have and not ctx.gpu.is_cpu else None


def plan_host_memory(ctx: Resolver, sol, count: int | None = None, problem=None) -> HostMemory | None:
    """Host RAM per node of a fit solution (of `problem`, default the plan's own fit problem)."""
    problem = problem or ctx.get(FIT_PROBLEM)
    if problem is None or ctx.gpu.is_cpu:  # CPU ranks: the host is the device, memory.fit counts it
        return None
    wl = workload(problem, sol.per_device_batch, sol.knobs)
    est = sol.estimate
    return host_memory(ctx.facts, wl, est.host_bytes, est.host_pinned_bytes, count or ctx.spec("hardware.count"))


def host_needs(ctx: Resolver, sol, problem=None) -> str:
    """'N GiB of host RAM per node (...)' for a solution, or '' on CPU."""
    hm = plan_host_memory(ctx, sol, None, problem)
    return f"it needs {hm.describe(ctx.spec('hardware.count'))}" if hm else ""


def check_host_memory(ctx: Resolver, sol) -> None:
    hm = plan_host_memory(ctx, sol)
    problem = ctx.get(FIT_PROBLEM)
    if hm is None or problem is None or not sol.fits:  # a plan that does not fit says so once (memory.fit)
        return
    count = ctx.spec("hardware.count")
    wl = workload(problem, sol.per_device_batch, sol.knobs)
    relevant = hm.offloaded > 0 or (wl.adapters is not None and wl.engine in ("fsdp", "deepspeed"))
    given = ctx.spec("hardware.host_memory_gib")
    have = known_host_bytes(ctx)
    if not (relevant or given):
        return
    if not have:
        ctx.note(
            "hardware.host_memory_gib",
            f"the plan needs {hm.describe(count)}; the training hosts' RAM is not known",
            fix=f"set hardware.host_memory_gib to the training hosts' RAM (at least {_need_gib(hm)}) to have it checked",
        )
        return
    if hm.peak <= HOST_LIMIT * have:
        return
    ctx.error(
        "hardware.host_memory_gib",
        f"the plan needs {hm.describe(count)}; the host has {have / GIB:.0f} GiB "
        f"({HOST_LIMIT:.0%} usable: {HOST_LIMIT * have / GIB:.0f} GiB)",
        fix="; or ".join(fix_line(f) for f in host_fixes(ctx, sol)),
    )


def host_fixes(ctx: Resolver, sol, problem=None) -> list[Fix]:
    """What brings the host RAM per node under the limit: the same GPUs with fewer per node (loading and
    offload are per rank), checked with the same arithmetic; or the RAM the hosts would need."""
    count, nodes = ctx.spec("hardware.count"), ctx.spec("hardware.nodes")
    limit = HOST_LIMIT * known_host_bytes(ctx)
    fixes = []
    for fewer in range(count // 2, 0, -1):
        hm = plan_host_memory(ctx, sol, fewer, problem)
        if hm is not None and (count * nodes) % fewer == 0 and hm.peak <= limit:
            fewer_per_node = (("hardware.count", fewer), ("hardware.nodes", count * nodes // fewer))
            fixes.append(Fix("host", fewer_per_node, f"the same GPUs, {hm.peak / GIB:.0f} GiB per node", verified=HOST_VERIFIED))
            break
    hm = plan_host_memory(ctx, sol, None, problem)
    if hm is not None:
        fixes.append(
            Fix(
                "host",
                (("hardware.host_memory_gib", _need_gib(hm)),),
                qualifier="or more, if the training hosts have that RAM",
                verified=HOST_VERIFIED,
            )
        )
    return fixes


def _need_gib(hm: HostMemory) -> int:
    return math.ceil(hm.peak / HOST_LIMIT / GIB)
