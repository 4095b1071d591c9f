"""memory_savers.empty_cache: empty the CUDA cache only when memory.fit needed it.

torch_empty_cache_steps: only near the memory limit (~10% slower, the guide);
meaningless on CPU, where there is no CUDA cache. Gradient checkpointing, the other
saver memory.fit chooses, is rules/checkpointing.py.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.fit.savers import CACHE_EMPTYING
from gpuplan.plan.rules.common import FIT_SOLUTION
from gpuplan.units import GIB


def empty_cache(ctx: Resolver) -> None:
    sol = ctx.get(FIT_SOLUTION)
    want = ctx.spec("training.torch_empty_cache_steps")
    if ctx.gpu.is_cpu and want not in (0, "auto"):
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
        saved = sol.saved_bytes.get(CACHE_EMPTYING.name, 0) / GIB
        why = (
            f"near the memory limit: emptying the CUDA cache every {steps} steps frees {saved:.1f} GiB of cached blocks (about 10% slower)"
        )
    else:
        why = "off: the run fits without emptying the CUDA cache (it costs about 10% speed)"
    ctx.resolve("training.torch_empty_cache_steps", steps, why)


RULES = (
    Rule(
        "memory_savers.empty_cache",
        reads=(FIT_SOLUTION, "spec:training.torch_empty_cache_steps"),
        writes=("training.torch_empty_cache_steps",),
        apply=empty_cache,
        doc="empty the CUDA cache only near the limit; off on CPU.",
    ),
)
