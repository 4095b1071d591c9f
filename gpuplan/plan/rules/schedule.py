"""schedule.warmup: warmup_steps or warmup_ratio, one of them, in steps where possible;
schedule.eval_scheduler: schedulers that step on the eval loss need eval data.

warmup_steps with warmup_ratio: error (TrainingArguments accepted only one); a
ratio becomes steps when max_steps is known, else a fraction (<1) the Trainer reads as a ratio.
"""

from __future__ import annotations

import math

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver


def warmup(ctx: Resolver) -> None:
    ratio = ctx.spec("training.warmup_ratio")
    if ratio is None:
        ctx.keep("training.warmup_steps")
        return
    if ctx.is_user("training.warmup_steps"):
        ctx.error("training.warmup_ratio", "training.warmup_steps and training.warmup_ratio are both set", fix="keep one of them")
        ctx.keep("training.warmup_steps")
        return
    max_steps = ctx.spec("training.max_steps")
    if max_steps:
        steps = math.ceil(ratio * max_steps)
        ctx.resolve("training.warmup_steps", steps, f"warmup_ratio {ratio} x max_steps {max_steps}, rounded up")
    else:
        ctx.resolve("training.warmup_steps", ratio, f"warmup_ratio {ratio} without max_steps: the Trainer reads a value below 1 as a ratio")


# Schedulers that step on the eval loss: TrainingArguments raises without an eval
# strategy ("lr_scheduler_type reduce_lr_on_plateau requires an eval strategy", 5.24).
EVAL_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")


def scheduler_needs_eval(ctx: Resolver) -> None:
    name = ctx.spec("training.lr_scheduler_type")
    if name in EVAL_SCHEDULERS and not ctx.spec("data.eval_files") and not ctx.spec("data.eval_fraction"):
        ctx.error(
            "training.lr_scheduler_type",
            f'training.lr_scheduler_type = "{name}" steps on the eval loss, but the spec has no eval data '
            "(TrainingArguments refuses it without an eval strategy)",
            fix='set data.eval_fraction = 0.05 (or data.eval_files), or training.lr_scheduler_type = "cosine"',
        )


RULES = (
    Rule(
        "schedule.eval_scheduler",
        reads=("spec:training.lr_scheduler_type", "spec:data.eval_files", "spec:data.eval_fraction"),
        writes=(),
        apply=scheduler_needs_eval,
        doc="reduce_lr_on_plateau and greedy need eval data.",
    ),
    Rule(
        "schedule.warmup",
        reads=("spec:training.warmup_ratio", "spec:training.warmup_steps", "spec:training.max_steps"),
        writes=("training.warmup_steps",),
        apply=warmup,
        doc="warmup_steps xor warmup_ratio; a ratio becomes steps.",
    ),
)
