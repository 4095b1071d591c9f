"""Memory savers chosen by memory.fit: gradient checkpointing and cache emptying.

Gradient checkpointing: auto turns it on only when the run does not fit without it
(~20% slower, the guide). torch_empty_cache_steps: only near the memory limit
(~10% slower, the guide); meaningless on CPU, where there is no CUDA cache.
"""

from __future__ import annotations

from gpuplan.plan.context import Resolver
from gpuplan.plan.graph import Rule

GIB = 1024**3


def checkpointing(ctx: Resolver) -> None:
    sol = ctx.get("fit.solution")
    if ctx.spec("training.gradient_checkpointing") != "auto":
        ctx.keep("training.gradient_checkpointing")
        return
    if sol is None:
        ctx.resolve("training.gradient_checkpointing", False, "off: the batch split did not resolve")
        return
    on = sol.knobs.gradient_checkpointing
    if on:
        saved = sol.saved_bytes.get("gradient checkpointing", 0) / GIB
        why = f"does not fit without it: recomputing activations saves {saved:.1f} GiB (about 20% slower)"
    else:
        why = "fits without it (it would cost about 20% speed)"
    ctx.resolve("training.gradient_checkpointing", on, why)


def empty_cache(ctx: Resolver) -> None:
    sol = ctx.get("fit.solution")
    want = ctx.spec("training.torch_empty_cache_steps")
    if ctx.gpu.vendor == "cpu" and want not in (0, "auto"):
        ctx.resolve("training.torch_empty_cache_steps", 0, "CPU training: there is no CUDA cache to empty")
        return
    if want != "auto" or sol is None:
        if want == "auto":
            ctx.resolve("training.torch_empty_cache_steps", 0, "off: the plan did not resolve")
        else:
            ctx.keep("training.torch_empty_cache_steps")
        return
    steps = sol.knobs.torch_empty_cache_steps
    if steps:
        saved = sol.saved_bytes.get("cache emptying", 0) / GIB
        why = f"near the memory limit: emptying the CUDA cache every {steps} steps frees {saved:.1f} GiB of cached blocks (about 10% slower)"
    else:
        why = "off: the run fits without emptying the CUDA cache (it costs about 10% speed)"
    ctx.resolve("training.torch_empty_cache_steps", steps, why)


RULES = (
    Rule("checkpointing.auto", reads=("fit.solution", "spec:training.gradient_checkpointing"),
         writes=("training.gradient_checkpointing",), apply=checkpointing,
         doc="on only when the run does not fit without it."),
    Rule("memory_savers.empty_cache", reads=("fit.solution", "spec:training.torch_empty_cache_steps"),
         writes=("training.torch_empty_cache_steps",), apply=empty_cache,
         doc="empty the CUDA cache only near the limit; off on CPU."),
)
