"""Activation offloading through the model's own forward (plan: memory/offload_activations.py).

`install(model)` runs the forward of the model (a peft model's base model) under
torch.autograd.graph.saved_tensors_hooks: each tensor autograd saves that is not a parameter
and holds at least MIN_BYTES is copied to pinned host memory when saved and copied back to its
device when backward unpacks it (torch.autograd.graph.save_on_cpu's mechanism, with torchtune
OffloadActivations' rule of leaving parameters and small tensors where they are). The hooks
stay with each saved tensor, so backward, outside the forward, finds them. The plan refuses it
on CPU devices and beside gradient checkpointing; `install` runs anywhere, which the CPU tests
use to check that gradients are unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from gpuplan.apply.model.chunked_loss import causal_lm_of
from gpuplan.plan.estimate.memory.offload_activations import MIN_BYTES


class Offloader:
    """pack/unpack hooks; `moved` counts the bytes it sent to host memory (for tests and logs)."""

    def __init__(self, min_bytes: int = MIN_BYTES) -> None:
        self.min_bytes = min_bytes
        self.moved = 0

    def pack(self, tensor: Any) -> Any:
        import torch

        nbytes = tensor.numel() * tensor.element_size()
        if isinstance(tensor, torch.nn.Parameter) or nbytes < self.min_bytes or tensor.is_sparse:
            return tensor
        pin = tensor.device.type == "cuda"
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=pin)
        host.copy_(tensor)
        self.moved += nbytes
        return (tensor.device, host)

    @staticmethod
    def unpack(packed: Any) -> Any:
        if isinstance(packed, tuple):
            device, host = packed
            return host.to(device, non_blocking=host.is_pinned())
        return packed


def install(model: Any, min_bytes: int = MIN_BYTES) -> Offloader:
    """Run the forward of the model in `model` with its saved tensors offloaded; returns the hooks."""
    lm = causal_lm_of(model)
    offloader = Offloader(min_bytes)
    _wrap(lm, offloader)
    return offloader


def _wrap(lm: Any, offloader: Offloader) -> None:
    import torch

    original = lm.forward

    @functools.wraps(original)  # the Trainer reads the signature
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.graph.saved_tensors_hooks(offloader.pack, offloader.unpack):
            return original(*args, **kwargs)

    forward._gpuplan_offloader = offloader  # type: ignore[attr-defined]
    lm.forward = forward
    lm._gpuplan_offloader = offloader


def installed(model: Any) -> bool:
    """Whether the forward the model runs is still the offloading one."""
    lm = causal_lm_of(model)
    return getattr(lm.forward, "_gpuplan_offloader", None) is not None


def keep_installed(model: Any) -> bool:
    """Wrap the model's forward again, with the same hooks, where something replaced it since
    install(); True when it had to. Trainer.train() applies Liger (training.use_liger_kernel)
    AFTER the model is built: transformers trainer.py `if self.args.use_liger_kernel:
    apply_liger_kernel(self.model, ...)` at the top of train(), and Liger's instance patch sets
    `model.forward = MethodType(lce_forward, model)` (liger_kernel/transformers/monkey_patch.py,
    apply_liger_kernel_to_llama and its siblings), dropping the offloading wrapper: the planned
    host-offloaded activations would stay on the GPU. Wrapping Liger's forward keeps both."""
    lm = causal_lm_of(model)
    offloader = getattr(lm, "_gpuplan_offloader", None)
    if offloader is None or installed(model):
        return False
    _wrap(lm, offloader)
    return True


def keep_installed_callback(model: Any) -> Any:
    """A TrainerCallback that re-wraps `model`'s forward at on_train_begin: after train() has
    applied Liger (trainer.py calls apply_liger_kernel before the inner loop's on_train_begin)."""
    from transformers import TrainerCallback

    class KeepActivationOffload(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            keep_installed(model)

    return KeepActivationOffload()
