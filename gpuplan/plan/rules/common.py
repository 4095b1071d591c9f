"""What more than one rule needs: the run's size, the Trainer's defaults, the solver's nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuplan.plan.engine.graph import Node
from gpuplan.plan.engine.resolver import Resolver

if TYPE_CHECKING:
    from gpuplan.modelinfo.lora_targets import AdapterCount
    from gpuplan.plan.fit.fixes import NoFit
    from gpuplan.plan.fit.search import FitProblem, FitSolution

# TrainingArguments.per_device_train_batch_size defaults to 8 (transformers
# training_args.py): without an effective batch that is the target per device.
TRAINER_DEFAULT_BATCH = 8

# Graph nodes memory.fit writes for the rules after it: the solver's problem and its
# solution. Not settings: the prefix keeps them from reading as spec keys.
FIT_SOLUTION: Node[FitSolution | None] = Node("fit.solution")
FIT_PROBLEM: Node[FitProblem | None] = Node("fit.problem")
FIT_METHOD: Node[tuple[str, tuple[tuple[str, FitSolution], ...]] | None] = Node("fit.method")  # (chosen, tried)
NO_FIT: Node[NoFit | None] = Node("fit.no_fit")  # why nothing fits and what would, as a record (fit/fixes.py)
# (adapter counts, target modules, modules to save) from lora.config
LORA_COUNT: Node[tuple[AdapterCount, tuple[str, ...], tuple[str, ...]] | None] = Node("lora.count")
QUANT_COMPUTE: Node[str] = Node("quantization.compute")  # the 4-bit compute dtype, also when no qlora is planned


def world_size(ctx: Resolver) -> int:
    """GPUs in the run: per node times nodes, as the spec gives them (a rule's view of
    HardwareSpec.world_size; the plan's is HardwareSection.world_size)."""
    return ctx.spec("hardware.count") * ctx.spec("hardware.nodes")
