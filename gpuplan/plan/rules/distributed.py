"""Scale-out strategy: DDP, FSDP or DeepSpeed ZeRO across hardware.count x hardware.nodes GPUs.

The candidates memory.fit tries come from `sharding_candidates`; "auto" tries DDP,
then FSDP SHARD_GRAD_OP (ZeRO-2: no more traffic than DDP), FULL_SHARD (ZeRO-3:
1.5x the traffic), then FULL_SHARD with CPU offload. This rule writes what the fit
chose and refuses the combinations peers refuse (reference/peer-rules.md):
bitsandbytes 8-bit optimizers with FSDP or DeepSpeed, FSDP options with DeepSpeed,
ZeRO options with FSDP, offload beyond the host's RAM, DeepSpeed on hardware "cpu" (it
needs CUDA; several CPU processes run DDP, or FSDP2 over gloo when asked: apply/train/fsdp_cpu.py).
torch.compile with FSDP: apply runs FSDP2, which keeps the original parameters (FSDP1's
use_orig_params is obsolete there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.fit.search import Sharding
from gpuplan.plan.inputs.target import install_note, is_local
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION
from gpuplan.spec.names import BNB_OPTIMIZERS

KEYS = (
    "distributed.strategy",
    "distributed.fsdp_sharding",
    "distributed.fsdp_cpu_offload",
    "distributed.zero_stage",
    "distributed.offload_optimizer",
    "distributed.offload_params",
)


def _fsdp(kind: str, count: int, world: int, offload: bool) -> Sharding:
    stage = 2 if kind == "shard_grad_op" else 3
    shard_world = count if kind == "hybrid_shard" else world  # HYBRID_SHARD: shard in a node, replicate across
    return Sharding("fsdp", stage, shard_world, offload, offload, kind)


def sharding_candidates(spec: Callable[[str], Any], packages: dict, cpu: bool = False) -> tuple[Sharding, ...]:
    """Layouts memory.fit may choose from, cheapest communication first (on "cpu": DDP unless FSDP is asked)."""
    count, nodes = spec("hardware.count"), spec("hardware.nodes")
    world = count * nodes
    strategy = spec("distributed.strategy")
    if world == 1 or strategy == "none":
        return (Sharding(),)
    if strategy == "fsdp":
        return (_fsdp(spec("distributed.fsdp_sharding"), count, world, spec("distributed.fsdp_cpu_offload")),)
    if strategy == "ddp" or cpu:  # "auto" on CPU processes: DDP (sharding saves no GPU memory there)
        return (Sharding("ddp", 0, 1),)
    if strategy == "deepspeed" and packages.get("deepspeed"):
        stage = spec("distributed.zero_stage")
        oo, op = spec("distributed.offload_optimizer"), spec("distributed.offload_params")
        stages = (1, 2, 3) if stage == "auto" else (stage,)
        out = [Sharding("deepspeed", s, world, oo, op and s == 3) for s in stages]
        if stage == "auto" and not (oo or op):
            out += [Sharding("deepspeed", 3, world, True, False), Sharding("deepspeed", 3, world, True, True)]
        return tuple(out)
    if strategy == "deepspeed":  # not installed: its torch-native equivalent
        return (_fsdp("full_shard", count, world, spec("distributed.offload_params")),)
    # auto
    bnb = spec("training.optim") in BNB_OPTIMIZERS
    ddp = (Sharding("ddp", 0, 1),)
    if bnb:
        return ddp  # 8-bit states do not shard: DDP only
    return ddp + (
        _fsdp("shard_grad_op", count, world, False),
        _fsdp("full_shard", count, world, False),
        _fsdp("full_shard", count, world, True),
    )


def strategy(ctx: Resolver) -> None:
    sol = ctx.get(FIT_SOLUTION)
    asked = ctx.spec("distributed.strategy")
    world = ctx.spec("hardware.count") * ctx.spec("hardware.nodes")
    _conflicts(ctx, asked)
    if ctx.gpu.is_cpu and world > 1 and asked == "deepspeed":
        ctx.error(
            "distributed.strategy",
            'distributed.strategy = "deepspeed" on hardware "cpu": DeepSpeed needs CUDA GPUs; '
            "several CPU processes train with DDP or FSDP2 over gloo",
            fix='set distributed.strategy = "fsdp" (or "ddp")',
        )
    if ctx.gpu.is_cpu and asked == "fsdp" and ctx.spec("distributed.fsdp_cpu_offload"):
        ctx.error(
            "distributed.fsdp_cpu_offload",
            'distributed.fsdp_cpu_offload = true on hardware "cpu": the parameters already live in host RAM, there is nothing to offload',
            fix="remove distributed.fsdp_cpu_offload",
        )
    if sol is None:
        for k in KEYS:
            ctx.keep(k)
        return
    sh: Sharding = sol.knobs.sharding
    chosen = sh.engine if sh.engine != "none" else "none"
    if world == 1:
        why = "one device: no data parallelism" if asked != "none" else None
        ctx.resolve("distributed.strategy", "none", why)
    elif asked == "auto":
        why = _auto_reason(ctx, sol, sh)
        ctx.resolve("distributed.strategy", chosen, why)
    elif asked == "deepspeed" and sh.engine == "fsdp":
        ctx.resolve(
            "distributed.strategy",
            "fsdp",
            "deepspeed is not installed here; FSDP FULL_SHARD is torch's equivalent of ZeRO-3 (pip install deepspeed to keep DeepSpeed)",
        )
    else:
        ctx.keep("distributed.strategy")
    if sh.engine == "fsdp":
        changed = sh.fsdp_sharding != ctx.spec("distributed.fsdp_sharding")
        ctx.resolve("distributed.fsdp_sharding", sh.fsdp_sharding, f"{sh.label} fits" if changed else None)
        ctx.resolve(
            "distributed.fsdp_cpu_offload",
            sh.offload_params,
            "nothing fits on the GPUs without offloading parameters and optimizer states to host RAM"
            if sh.offload_params
            else f"{sh.label} fits without offload to host RAM (offload runs the optimizer step on the CPU)",
        )
    else:
        ctx.keep("distributed.fsdp_sharding")
        ctx.keep("distributed.fsdp_cpu_offload")
    if sh.engine == "deepspeed" and not is_local(ctx.spec):
        install_note(ctx, "distributed.strategy", "deepspeed", "DeepSpeed ZeRO")
    if sh.engine == "deepspeed":
        ctx.resolve("distributed.zero_stage", sh.zero_stage, f"the lowest ZeRO stage that fits ({sh.label})")
        ctx.resolve(
            "distributed.offload_optimizer",
            sh.offload_optimizer,
            "ZeRO-3 alone does not fit" if sh.offload_optimizer else f"{sh.label} fits without optimizer offload",
        )
        ctx.resolve(
            "distributed.offload_params",
            sh.offload_params,
            "ZeRO-3 with optimizer offload does not fit"
            if sh.offload_params
            else ("parameter offload needs ZeRO-3; " if sh.zero_stage < 3 else "") + f"{sh.label} fits without it",
        )
    else:
        for k in KEYS[3:]:
            ctx.keep(k)
    _host_memory(ctx, sol)


def _auto_reason(ctx: Resolver, sol, sh: Sharding) -> str:
    world = ctx.spec("hardware.count") * ctx.spec("hardware.nodes")
    if sh.engine == "ddp":
        return f"the model and its states fit on each GPU: DDP, one all-reduce of the gradients per step over {world} GPUs"
    if sh.zero_stage == 2:
        return (
            f"a full replica does not fit; {sh.label} shards gradients and optimizer states over {sh.shard_world_size} "
            "GPUs at no more traffic than DDP (ZeRO-2)"
        )
    if sh.offload_params:
        return f"even fully sharded the states do not fit: {sh.label} keeps them in host RAM (slow: CPU optimizer step)"
    return (
        f"gradients and optimizer states sharded are not enough; {sh.label} also shards the parameters over "
        f"{sh.shard_world_size} GPUs (ZeRO-3, 1.5x DDP's traffic)"
    )


def _conflicts(ctx: Resolver, asked: str) -> None:
    optim = ctx.spec("training.optim")
    if asked in ("fsdp", "deepspeed") and optim in BNB_OPTIMIZERS:
        ctx.error(
            "training.optim",
            f'training.optim = "{optim}" (bitsandbytes 8-bit) with distributed.strategy = "{asked}": '
            "its quantized states cannot be sharded",
            fix='set training.optim = "auto" or distributed.strategy = "ddp"',
        )
    fsdp_set = [k for k in ("fsdp_sharding", "fsdp_cpu_offload") if ctx.is_user(f"distributed.{k}")]
    zero_set = [k for k in ("zero_stage", "offload_optimizer", "offload_params") if ctx.is_user(f"distributed.{k}")]
    if asked == "deepspeed" and fsdp_set:
        ctx.error(
            f"distributed.{fsdp_set[0]}",
            f'distributed.{fsdp_set[0]} is an FSDP option but distributed.strategy = "deepspeed": '
            "DeepSpeed and FSDP cannot be used together",
            fix=f"remove distributed.{fsdp_set[0]}",
        )
    if ctx.is_user("distributed.fsdp_sharding") and ctx.spec("distributed.fsdp_sharding") == "hybrid_shard":
        ctx.error(
            "distributed.fsdp_sharding",
            'distributed.fsdp_sharding = "hybrid_shard" is not applied: gpuplan runs FSDP2, '
            "and transformers 5.24 offers hybrid sharding only through the deprecated FSDP1",
            fix='set distributed.fsdp_sharding = "full_shard" (or "shard_grad_op")',
        )
    if asked == "fsdp" and zero_set:
        ctx.error(
            f"distributed.{zero_set[0]}",
            f'distributed.{zero_set[0]} is a DeepSpeed option but distributed.strategy = "fsdp"',
            fix=f'remove distributed.{zero_set[0]} or set distributed.strategy = "deepspeed"',
        )
    if ctx.spec("training.torch_compile") and asked in ("fsdp", "auto") and ctx.spec("hardware.count") * ctx.spec("hardware.nodes") > 1:
        ctx.note(
            "training.torch_compile",
            "torch.compile with FSDP: apply uses FSDP2, which keeps the original parameters (no use_orig_params needed)",
        )


def _host_memory(ctx: Resolver, sol) -> None:
    from gpuplan.plan.fit.host_memory import check_host_memory  # host RAM per node (estimate/memory/host.py)

    check_host_memory(ctx, sol)


RULES = (
    Rule(
        "distributed.strategy",
        reads=(
            FIT_SOLUTION,
            FIT_PROBLEM,
            "spec:distributed.strategy",
            "spec:hardware.count",
            "spec:hardware.nodes",
            "spec:hardware.host_memory_gib",
            "spec:training.optim",
            "spec:training.torch_compile",
            "spec:hardware.gpu",
            "spec:distributed.fsdp_sharding",
            "spec:distributed.fsdp_cpu_offload",
            "spec:distributed.zero_stage",
            "spec:distributed.offload_optimizer",
            "spec:distributed.offload_params",
        ),
        writes=KEYS,
        apply=strategy,
        doc="DDP/FSDP/DeepSpeed: the cheapest that fits; refuses 8-bit with sharding, FSDP with DeepSpeed, offload beyond host RAM.",
    ),
)
