"""A GRPO / RLOO training step under FakeTensorMode, as TRL 1.16 runs it after a generation round.

What trl/trainer/grpo_trainer.py does (rloo_trainer.py the same way), with TRL's own fused LM head
(trainer/utils.py `add_fused_lm_head`, outputs log_probs and entropy):
- the round (`_generate_and_score_completions`): its tensors are kept for all its micro-batches (prompt
  and completion ids and masks, int64; the advantages; per completion token the old-policy and the
  reference log-probs, fp32), the log-probs computed without gradients micro-batch by micro-batch
  (`_get_per_token_logps_and_entropies(batch_size=per_device_train_batch_size)`): the old policy's when
  the plan's step objective runs them (memory/generation.py step_objective), the reference's when one is
  planned (a frozen copy, or the peft model with its adapters disabled). The completions themselves are
  given, not generated: model.generate samples and stops on data a fake tensor does not have, so the
  generation moment (the transformers KV cache, vLLM's share) is the analytic model's alone
  (memory/generation.py), and the trace checks the training step and the round's tensors.
- each micro-batch (`_compute_loss`): the policy's log-probs and entropies over prompt + completion with
  gradients, the clipped importance ratio against the old log-probs, the KL term against the reference's
  when beta != 0, the DAPO normalization over the completion tokens, and backward.
The trainer's metrics reduce these to scalars with `.item()`, which fake tensors cannot do: left out.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from gpuplan.plan.estimate.memory.generation import step_objective
from gpuplan.plan.estimate.memory.types import Workload

RL_HEAD_OUTPUTS = ("log_probs", "entropy")  # grpo_trainer.py add_fused_lm_head(..., outputs=("log_probs", "entropy"))
EPSILON, BETA = 0.2, 0.04  # GRPOConfig.epsilon's default; a beta > 0 (its value does not change the memory)


def _logps(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, completion: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, use_cache=False)
    entropy = out.entropy[:, -completion:] if out.entropy is not None else None  # the reference's head has none
    return out.log_probs[:, -completion:], entropy


def make_round(
    model: torch.nn.Module, ref: torch.nn.Module | None, wl: Workload, vocab: int, amp_dtype: Any
) -> list[dict[str, torch.Tensor]]:
    """The round's micro-batches (per_device_batch completions each), as TRL buffers them."""
    obj = step_objective(wl)
    n, s, c, b = wl.generation_sequences, wl.seq_len, wl.rl_completion_len, wl.per_device_batch
    ids = torch.randint(0, max(vocab, 2), (n, s))
    mask = torch.ones(n, s, dtype=torch.long)
    autocast = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    old = ref_logps = None
    with torch.no_grad(), autocast:
        if obj.nograd_policy_sequences:
            old = torch.cat([_logps(model, ids[i : i + b], mask[i : i + b], c)[0] for i in range(0, n, b)])
        if wl.reference != "none":
            if ref is None:  # peft: the same model with its adapters disabled (trl use_adapter(model, None))
                disable = getattr(model, "disable_adapter", None)
                with disable() if disable is not None else nullcontext():
                    ref_logps = torch.cat([_logps(model, ids[i : i + b], mask[i : i + b], c)[0] for i in range(0, n, b)])
            else:
                ref_logps = torch.cat([_logps(ref, ids[i : i + b], mask[i : i + b], c)[0] for i in range(0, n, b)])
    advantages = torch.randn(n)
    out = []
    for i in range(0, n, b):
        mb = {
            "prompt_ids": ids[i : i + b, : s - c].clone(),
            "prompt_mask": mask[i : i + b, : s - c].clone(),
            "completion_ids": ids[i : i + b, s - c :].clone(),
            "completion_mask": mask[i : i + b, s - c :].clone(),
            "advantages": advantages[i : i + b].clone(),
        }
        if old is not None:
            mb["old_per_token_logps"] = old[i : i + b].clone()
        if ref_logps is not None:
            mb["ref_per_token_logps"] = ref_logps[i : i + b].clone()
        out.append(mb)
    del ids, mask, old, ref_logps, advantages
    return out


def rl_loss(model: torch.nn.Module, inputs: dict[str, torch.Tensor], amp_dtype: Any) -> torch.Tensor:
    """One micro-batch's loss (grpo_trainer.py _compute_loss, loss_type "dapo"); backward is the caller's."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    mask = inputs["completion_mask"]
    autocast = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype is not None else nullcontext()
    with autocast:
        logps, _entropies = _logps(model, ids, attention, mask.shape[1])
    advantages = inputs["advantages"].unsqueeze(1)
    old = inputs.get("old_per_token_logps")
    old = logps.detach() if old is None else old
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - EPSILON, 1 + EPSILON)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    ref = inputs.get("ref_per_token_logps")
    if ref is not None:
        per_token_loss = per_token_loss + BETA * (torch.exp(ref - logps) - (ref - logps) - 1)
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
