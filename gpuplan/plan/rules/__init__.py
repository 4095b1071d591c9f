"""Every planning rule, one module per topic, named for its rule ids.

ALL_RULES is what the planner walks; find_rule turns the `rule` of a Change back
into the Rule that wrote it (rule `x.y` lives in rules/<x>.py).
"""

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.rules import (
    attention,
    batch,
    checkpointing,
    compile,
    data,
    dataloader,
    distributed,
    liger,
    lora,
    loss_chunking,
    memory,
    memory_savers,
    offload_activations,
    optimizer,
    precision,
    preference,
    quantization,
    schedule,
    tracking,
    vision,
)

ALL_RULES = (
    *precision.RULES,
    *attention.RULES,
    *compile.RULES,
    *dataloader.RULES,
    *data.RULES,
    *vision.RULES,
    *schedule.RULES,
    *memory.RULES,
    *batch.RULES,
    *optimizer.RULES,
    *checkpointing.RULES,
    *loss_chunking.RULES,
    *liger.RULES,
    *memory_savers.RULES,
    *offload_activations.RULES,
    *distributed.RULES,
    *tracking.RULES,
    *lora.RULES,
    *quantization.RULES,
    *preference.RULES,
)

__all__ = ["ALL_RULES", "find_rule"]


def find_rule(rule_id: str) -> Rule:
    """The Rule whose id is `rule_id`, or that records Changes under it (Rule.explains)."""
    for rule in ALL_RULES:
        if rule.id == rule_id or rule_id in rule.explains:
            return rule
    raise KeyError(f"no rule {rule_id!r}")
