"""What more than one rule needs: the run's size, the Trainer's defaults, the solver's nodes."""

from __future__ import annotations

from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.engine.graph import INTERNAL

# TrainingArguments.per_device_train_batch_size defaults to 8 (transformers
# training_args.py): without an effective batch that is the target per device.
TRAINER_DEFAULT_BATCH = 8

# Graph nodes memory.fit writes for the rules after it: the solver's problem and its
# solution. Not settings: the prefix keeps them from reading as spec keys.
FIT_SOLUTION = INTERNAL + "fit.solution"
FIT_PROBLEM = INTERNAL + "fit.problem"
FIT_METHOD = INTERNAL + "fit.method"  # (method chosen, ((method, solution) tried, ...))
LORA_COUNT = INTERNAL + "lora.count"  # (adapter counts, targets) from lora.config
QUANT_COMPUTE = INTERNAL + "quantization.compute"  # the 4-bit compute dtype, also when no qlora is planned


def world_size(ctx: Resolver) -> int:
    """GPUs in the run: per node times nodes, as the spec gives them."""
    return ctx.spec("hardware.count") * ctx.spec("hardware.nodes")
