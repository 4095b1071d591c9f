"""schedule.warmup: warmup_steps or warmup_ratio, one of them, in steps where possible.

warmup_steps with warmup_ratio: error (TrainingArguments accepted only one); a
ratio becomes steps when max_steps is known, else a fraction (<1) the Trainer reads as a ratio.
"""

from __future__ import annotations

import math

from gpuplan.plan.context import Resolver
from gpuplan.plan.graph import Rule


def warmup(ctx: Resolver) -> None:
    ratio = ctx.spec("training.warmup_ratio")
    if ratio is None:
        ctx.keep("training.warmup_steps")
        return
    if ctx.is_user("training.warmup_steps"):
        ctx.error("training.warmup_ratio", "training.warmup_steps and training.warmup_ratio are both set",
                  fix="keep one of them")
        ctx.keep("training.warmup_steps")
        return
    max_steps = ctx.spec("training.max_steps")
    if max_steps:
        steps = math.ceil(ratio * max_steps)
        ctx.resolve("training.warmup_steps", steps, f"warmup_ratio {ratio} x max_steps {max_steps}, rounded up")
    else:
        ctx.resolve("training.warmup_steps", ratio,
                    f"warmup_ratio {ratio} without max_steps: the Trainer reads a value below 1 as a ratio")


RULES = (
    Rule("schedule.warmup", reads=("spec:training.warmup_ratio", "spec:training.warmup_steps", "spec:training.max_steps"),
         writes=("training.warmup_steps",), apply=warmup,
         doc="warmup_steps xor warmup_ratio; a ratio becomes steps."),
)
