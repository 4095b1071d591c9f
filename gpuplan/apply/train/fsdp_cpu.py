"""FSDP2 on CPU ranks over gloo: the one step accelerate 1.15 leaves out.

torch 2.13's `fully_shard` trains on CPU tensors over gloo, and the Trainer builds
accelerate's FullyShardedDataParallelPlugin from `fsdp=True` + `fsdp_config` on CPU as on
CUDA (trainer.py create_accelerator_and_postprocess). accelerate then drops the plugin
without a word: AcceleratorState.__init__ (accelerate/state.py:986-1016) sets
`distributed_type = FSDP` only when the process group is one of MULTI_GPU, MULTI_MLU,
MULTI_SDAA, MULTI_MUSA, MULTI_NPU, MULTI_XPU, MULTI_HPU, MULTI_NEURON; CPU ranks are
MULTI_CPU (state.py:801-808), so the run silently becomes DDP. There is no flag or
environment variable through it (ACCELERATE_USE_FSDP is read inside the same branch).

`FSDPOnCPUTrainer` creates the Accelerator as the Trainer does and then finishes what
state.py:1013-1016 would have done on a GPU: distributed_type FSDP, the plugin's mixed
precision, the plugin on the state, and the type on PartialState too (state.py:1037). From there accelerate's own FSDP2 path runs
unchanged (fsdp2_prepare_model: `fully_shard` per decoder layer; FSDP checkpoints via
save_fsdp_model / save_fsdp_optimizer), so CPU tests exercise the same mapping
(apply/train/arguments.py `_sharded_kwargs`) that GPU runs use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from transformers import Trainer

    from gpuplan.plan.types import Plan

T = TypeVar("T", bound="Trainer")


def promote_to_fsdp(accelerator: Any, plugin_args: dict[str, Any]) -> bool:
    """Turn a MULTI_CPU accelerator into an FSDP one with the Trainer's plugin; True when it did."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    if state.mixed_precision != "no":  # as state.py:1014-1015 does for GPUs
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # as state.py:1037 does: every later AcceleratorState() copies PartialState's dict over its own
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def trainer_class(base: type[T]) -> type[T]:
    """`base` (transformers.Trainer; TRL's DPOTrainer / KTOTrainer for a preference objective)
    whose Accelerator keeps the FSDP plugin on CPU ranks.

    TRL 1.16's trainers subclass transformers.Trainer and inherit its
    create_accelerator_and_postprocess, so the same accelerate drop hits them: built as they are,
    a CPU FSDP dpo / kto run trains under DDP. The promotion happens inside Trainer.__init__,
    before TRL's own __init__ goes on, so TRL sees `is_fsdp_enabled` and shards its reference
    model with fully_shard too (trl/trainer/dpo_trainer.py and kto_trainer.py: `elif
    self.is_fsdp_enabled: self.ref_model = prepare_fsdp(...)`, trl/models/utils.py)."""

    class FSDPOnCPUTrainer(base):  # type: ignore[valid-type,misc]
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            if self.args.fsdp_plugin_args is not None and promote_to_fsdp(self.accelerator, self.args.fsdp_plugin_args):
                self.is_fsdp_enabled = True

    FSDPOnCPUTrainer.__name__ = FSDPOnCPUTrainer.__qualname__ = f"FSDPOnCPU{base.__name__}"
    return FSDPOnCPUTrainer


def trainer_for(plan: Plan, base: type[T]) -> type[T]:
    """The class to build the run's trainer from: `base`, or its FSDPOnCPU subclass for FSDP on CPU ranks."""
    from gpuplan.apply.train.arguments import uses_cpu

    if uses_cpu(plan) and plan.resolved.distributed.strategy == "fsdp":
        return trainer_class(base)
    return base
