"""checkpointing.auto: gradient checkpointing only when the run does not fit without it.

Recomputing activations in the backward pass costs about 20% speed (the guide,
"Gradient checkpointing"); memory.fit turns it on only when nothing cheaper fits.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.fit.savers import CHECKPOINTING
from gpuplan.plan.rules.common import FIT_SOLUTION
from gpuplan.units import GIB


def checkpointing(ctx: Resolver) -> None:
    sol = ctx.get(FIT_SOLUTION)
    if ctx.spec("training.gradient_checkpointing") != "auto":
        ctx.keep("training.gradient_checkpointing")
        return
    if sol is None:
        ctx.resolve("training.gradient_checkpointing", False, "off: the batch split did not resolve")
        return
    on = sol.knobs.gradient_checkpointing
    if ctx.spec("training.activation_offloading"):
        ctx.resolve(
            "training.gradient_checkpointing",
            False,
            "off: activation offloading keeps the activations in host RAM instead (training.activation_offloading)",
        )
        return
    if on:
        saved = sol.saved_bytes.get(CHECKPOINTING.name, 0) / GIB
        why = f"does not fit without it: recomputing activations saves {saved:.1f} GiB (about 20% slower)"
    else:
        why = "fits without it (it would cost about 20% speed)"
    ctx.resolve("training.gradient_checkpointing", on, why)


RULES = (
    Rule(
        "checkpointing.auto",
        reads=(FIT_SOLUTION, "spec:training.gradient_checkpointing", "spec:training.activation_offloading"),
        writes=("training.gradient_checkpointing",),
        apply=checkpointing,
        doc="on only when the run does not fit without it.",
    ),
)
