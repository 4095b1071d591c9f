"""Chunked cross-entropy through the model's own forward (plan: estimate/memory/loss_chunking.py).

`install(model, chunk)` patches the forward of the CausalLM inside `model` (a peft model's
base model too). While a batch with labels runs, the output head is swapped for a
pass-through, so the family's forward hands the final hidden states to `self.loss_function`,
which is swapped for `chunked_causal_lm_loss`: the real head and the cross-entropy over
`chunk` tokens at a time, each chunk under non-reentrant torch.utils.checkpoint, so its
logits and their fp32 copies are recomputed in backward one chunk at a time.

It is the model's forward that changes, so DDP's and FSDP's hooks (which wrap the call),
peft's adapters and modules_to_save on the head, autocast, the Trainer's num_items_in_batch
(gradient accumulation) and every data path (plain, packed, chat masks of -100) run as
without it. The loss is transformers' ForCausalLMLoss (loss/loss_utils.py): labels shifted
left with ignore_index padding, fp32 cross-entropy, summed over `num_items_in_batch`
when the Trainer passes it, else the mean over tokens not ignored. The output carries no
logits (None): training and loss-only evaluation read only the loss.
"""

from __future__ import annotations

import functools
from typing import Any

from gpuplan.plan.estimate.memory.loss_chunking import unavailable

IGNORE_INDEX = -100  # transformers' and torch's cross_entropy default
_UNSET = object()


def _chunk_loss(hidden: Any, labels: Any, head: Any, ignore_index: int) -> Any:
    import torch.nn.functional as F

    logits = head(hidden).float()  # ForCausalLMLoss upcasts before the loss
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")


def chunked_causal_lm_loss(
    logits: Any,
    labels: Any,
    vocab_size: int,
    num_items_in_batch: Any = None,
    ignore_index: int = IGNORE_INDEX,
    shift_labels: Any = None,
    *,
    head: Any,
    chunk: int,
    **kwargs: Any,
) -> Any:
    """ForCausalLMLoss where `logits` are the final hidden states and `head` makes the logits."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    hidden = logits
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = shift_labels.reshape(-1).to(flat.device)
    total = None
    for start in range(0, flat.shape[0], chunk):
        part = checkpoint(_chunk_loss, flat[start : start + chunk], targets[start : start + chunk], head, ignore_index, use_reentrant=False)
        total = part if total is None else total + part
    assert total is not None, "a batch holds at least one token"
    if num_items_in_batch is None:
        count = (targets != ignore_index).sum()
        return total / count
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class _PassThrough:
    """Stands in for the head during the patched forward: returns the hidden states."""

    @staticmethod
    def make() -> Any:
        import torch

        class PassThrough(torch.nn.Module):
            def forward(self, hidden: Any) -> Any:
                return hidden

        return PassThrough()


def causal_lm_of(model: Any) -> Any:
    """The transformers CausalLM inside `model` (a peft model's base model)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(model, "peft_config") else model


def head_name(lm: Any) -> str:
    """The attribute of `lm` that holds its output head."""
    head = lm.get_output_embeddings()
    for name, child in lm.named_children():
        if child is head:
            return name
    raise ValueError(f"{type(lm).__name__}'s output head is not a direct child module: chunked cross-entropy cannot swap it")


def install(model: Any, chunk: int) -> Any:
    """Patch the forward of the CausalLM in `model` to compute its loss in chunks; returns `model`."""
    if chunk < 1:
        raise ValueError(f"loss chunk size must be >= 1, got {chunk}")
    lm = causal_lm_of(model)
    why = unavailable(lm.config.model_type, "causal-lm")
    if why:
        raise ValueError(why)
    if getattr(lm.config, "final_logit_softcapping", None):
        raise ValueError(f"{lm.config.model_type} soft-caps its logits before the loss: chunked cross-entropy would skip the cap")
    name = head_name(lm)
    original = lm.forward
    passthrough = _PassThrough.make()

    @functools.wraps(original)  # the Trainer reads the signature (loss kwargs, dataset columns)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("labels") is None:
            return original(*args, **kwargs)
        head = lm._modules[name]
        before = lm.__dict__.get("_loss_function", _UNSET)
        lm._modules[name] = passthrough
        lm.loss_function = functools.partial(chunked_causal_lm_loss, head=head, chunk=chunk)
        try:
            out = original(*args, **kwargs)
        finally:
            lm._modules[name] = head
            if before is _UNSET:
                del lm._loss_function  # back to the class's loss_function property
            else:
                lm._loss_function = before
        out["logits"] = None  # they were the hidden states; no full logits exist
        return out

    lm.forward = forward
    lm._gpuplan_loss_chunk_size = chunk
    return model
