"""Every planning rule, one module per topic. ALL_RULES is what the planner walks."""

from gpuplan.plan.rules import attention, batch, compile, data, dataloader, distributed, fit, lora, optimizer, precision, savers

ALL_RULES = (
    *precision.RULES,
    *attention.RULES,
    *compile.RULES,
    *dataloader.RULES,
    *data.RULES,
    *fit.RULES,
    *batch.RULES,
    *optimizer.RULES,
    *savers.RULES,
    *distributed.RULES,
    *lora.RULES,
)
