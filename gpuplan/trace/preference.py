"""A DPO / KTO training step under FakeTensorMode, as TRL 1.16 runs it.

What trl/trainer/dpo_trainer.py `_compute_loss` (and kto_trainer.py's) does, with TRL's own
fused LM head (trainer/utils.py `add_fused_lm_head` -> kernels/chunked_logprob.py
`ChunkedLogProbFunction`): the batch of `per_device_batch` examples becomes
objective.grad_sequences x b sequences through the policy with gradients ([chosen; rejected]
for DPO), KTO's mismatched KL completions through the policy without gradients, and the
reference forwards without gradients (a frozen copy, or the same peft model with its
adapters disabled, `use_adapter(model, None)`), then the loss from the summed per-token
log-probs and backward. The trainer's logged metrics reduce these to scalars with `.item()`,
which fake tensors cannot do, and are left out (a few scalars).

On CUDA the head's fold of each [4096, 32768] logits tile into log-sum-exp statistics is a
Triton kernel that writes in place, and the fp32 gradient accumulation is one addmm with
out_dtype=float32 (chunked_logprob.py `_addmm_fp32`): neither allocates. A CPU build of
torch runs their torch fallbacks instead, so for a CUDA plan they are replaced by in-place
no-ops, as gpuplan/trace/build.py does for bitsandbytes' CUDA update kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from gpuplan.plan.estimate.memory.types import WeightDtype, Workload
from gpuplan.spec.objectives import objective

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_HEAD_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")  # dpo_trainer.py: the metrics' fields


@contextmanager
def cuda_head_kernels(cuda: bool):
    """TRL's Triton fold and CUDA addmm: in place, nothing allocated (see the module docstring)."""
    if not cuda:
        yield
        return
    from trl.kernels import chunked_logprob as ck

    saved = ck._forward_tile, ck._backward_tile, ck._addmm_fp32
    ck._forward_tile = lambda *a, **k: None
    ck._backward_tile = lambda *a, **k: None
    ck._addmm_fp32 = lambda acc, a, b: None
    try:
        yield
    finally:
        ck._forward_tile, ck._backward_tile, ck._addmm_fp32 = saved


def add_head(model: torch.nn.Module, outputs: tuple[str, ...] = _HEAD_OUTPUTS) -> None:
    """TRL's fused LM head on the model (under peft: on its base model, as the trainers do); `outputs`:
    the per-token tensors it returns (dpo / kto: the metrics' four; grpo / rloo: log_probs, entropy)."""
    from trl.trainer.utils import add_fused_lm_head

    get_base = getattr(model, "get_base_model", None)  # a PeftModel's
    base = cast("PreTrainedModel", get_base() if get_base is not None else model)  # build_model's model
    add_fused_lm_head(base, outputs=outputs)


def build_reference(config: Mapping[str, Any], wl: Workload) -> torch.nn.Module | None:
    """The frozen reference copy (reference = copy) in its dtype (memory/preference.py
    reference_element_bytes: the policy's for full fine-tuning, else the compute dtype); None otherwise."""
    if wl.reference != "copy":
        return None
    from gpuplan.trace.build import build_model

    amp_dtypes: dict[str, WeightDtype] = {"bf16": "bfloat16", "fp16": "float16"}
    compute = amp_dtypes.get(wl.amp or "", wl.weight_dtype)
    dtype = wl.weight_dtype if wl.adapters is None else compute  # full fine-tuning: the policy's dtype, as TRL builds it
    ref = build_model(config, dataclasses.replace(wl, weight_dtype=dtype, adapters=None, gradient_checkpointing=False))
    ref.eval()
    ref.requires_grad_(False)
    add_head(ref, ("log_probs",) if wl.generation != "none" else _HEAD_OUTPUTS)  # grpo_trainer.py: the reference's head returns log_probs
    return ref


def _batch(n: int, s: int, vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, max(vocab, 2), (n, s))
    completion = torch.ones(n, s, dtype=torch.long)  # every position scored: the head's largest case
    return {"input_ids": ids, "labels": ids.masked_fill(completion == 0, -100)}


def _logps(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(input_ids=batch["input_ids"], labels=batch["labels"], fused_lm_head=True, use_cache=False)
    return out.log_probs.sum(dim=1)


def preference_loss(
    model: torch.nn.Module, ref: torch.nn.Module | None, wl: Workload, vocab: int, amp_dtype: Any, on_head: Any = None
) -> torch.Tensor:
    """One micro-batch's loss (backward is the caller's); `on_head` marks where the head starts."""
    obj = objective(wl.objective, wl.loss_type)
    b, s = wl.per_device_batch, wl.seq_len
    autocast = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    beta = 0.1
    with autocast:
        kl = None
        if obj.nograd_policy_sequences:  # KTO: the KL completions through the policy, no gradients
            with torch.no_grad():
                kl = _logps(model, _batch(obj.nograd_policy_sequences * b, s, vocab))
        logps = _logps(model, _batch(obj.grad_sequences * b, s, vocab))
        ref_logps = None
        if wl.reference != "precomputed":
            calls = 1 if obj.paired else obj.reference_sequences  # KTO: completion, then KL
            per_call = obj.reference_sequences * b // calls
            with torch.no_grad():
                if ref is None:  # peft: the same model with its adapters disabled
                    disable = getattr(model, "disable_adapter", None)  # a PeftModel's
                    ctx = disable() if disable is not None else nullcontext()
                    with ctx:
                        parts = [_logps(model, _batch(per_call, s, vocab)) for _ in range(calls)]
                else:
                    parts = [_logps(ref, _batch(per_call, s, vocab)) for _ in range(calls)]
            ref_logps = parts[0]
        else:  # precomputed: a column of the dataset, two fp32 values per example
            ref_logps = torch.zeros(obj.grad_sequences * b)
    ratios = logps - ref_logps[: logps.shape[0]]
    if obj.paired:  # DPO, loss_type sigmoid: -logsigmoid(beta * (chosen ratio - rejected ratio))
        chosen, rejected = ratios.chunk(2, dim=0)
        return -F.logsigmoid(beta * (chosen - rejected)).mean()
    # KTO: 1 - sigmoid(beta * (ratio - KL)), the KL estimate clamped at 0 and detached
    z = kl.mean().clamp(min=0).detach() if kl is not None else 0.0
    return (1 - torch.sigmoid(beta * (ratios - z))).mean()
