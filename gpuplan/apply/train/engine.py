"""Which data-parallel engine really wrapped the model: read from the live module, not the plan.

The Trainer and accelerate pick the engine from TrainingArguments and the process group;
they can fall back silently (accelerate 1.15 drops the FSDP plugin on CPU ranks, see
fsdp_cpu.py). The run records what wrapped the model so a test, and the user, can see it.
FSDP2 marks every `fully_shard` unit as an FSDPModule; its param group reshards after
forward under FULL_SHARD (ZeRO-3) and keeps the unsharded parameters under SHARD_GRAD_OP
(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py `_reshard_after_forward`).
"""

from __future__ import annotations

from typing import Any


def engine_of(model: Any) -> str:
    """ "ddp", "fsdp2 full_shard", "fsdp2 shard_grad_op" or "none" for the Trainer's wrapped model."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return "ddp"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return "none"
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        return "none"
    # the root unit follows torch's reshard heuristic (accelerate fsdp_utils.py); the layers follow the plan
    groups = [g for m in units[1:] or units for g in m._get_fsdp_state()._fsdp_param_groups]
    return "fsdp2 full_shard" if any(g._reshard_after_forward for g in groups) else "fsdp2 shard_grad_op"


def fsdp_units(model: Any) -> int:
    """How many fully_shard units wrap the model (0 without FSDP2): decoder layers, embedding, tail, root."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return 0
    return sum(isinstance(m, FSDPModule) for m in model.modules())


def four_bit_weights(model: Any) -> dict[str, int]:
    """{"sharded": n, "whole": m}: bitsandbytes Linear4bit weights FSDP turned into DTensor shards, and
    those left whole (a uint8 quant storage is put in FSDP's ignored_params: accelerate fsdp_utils.py)."""
    from torch.distributed.tensor import DTensor

    out = {"sharded": 0, "whole": 0}
    for m in model.modules():
        if type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes"):  # not peft's wrapper
            out["sharded" if isinstance(m.weight, DTensor) else "whole"] += 1
    return out
