"""What a preference objective (DPO, KTO) adds to a step's memory, part by part.

The objective's descriptor (spec/objectives.py) says how many sequences an example puts
through the policy with gradients; the step is priced as SFT's on that many sequences
(`policy_workload`), with two differences, both from TRL 1.16:

- The loss path. TRL's fused LM head (trainer/utils.py `add_fused_lm_head`, kernels/
  chunked_logprob.py `ChunkedLogProbFunction`) never builds the (tokens x vocab) logits: it
  projects [4096 tokens x 32768 vocabulary] tiles into one reused buffer and keeps seven fp32
  statistics per token. It saves for backward the flattened hidden states, the targets and
  two fp32 values per token; the trainer's per-token outputs (log-prob, entropy, mean logit,
  top-1 flag) are masked copies. Backward accumulates the hidden states' gradient in fp32 and,
  when the head trains (full fine-tuning), the head's weight gradient in fp32 too.
- The reference. A frozen copy of the policy in the compute dtype (full fine-tuning), none
  for adapters (peft disables them: the base is the reference), none when its log-probs
  were precomputed. Its forward runs without gradients after the policy's: its largest
  moment is its own head, while the policy's saved activations are alive.

Coefficients are counted from the code above and checked against the fake-tensor trace of
a real DPO step (gpuplan/trace/preference.py; tests/apply/test_preference_memory.py). Every
position is scored, as TRL does on devices without Triton; on CUDA it scores the completion
tokens only (`hidden_states[mask]`), so for pairs with long prompts this is an upper bound.
"""

from __future__ import annotations

import dataclasses
import math

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.spec.objectives import objective

TOKEN_CHUNK = 4096  # kernels/chunked_logprob.py TOKEN_CHUNK_SIZE
VOCAB_CHUNK = 32768  # trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: the buffer is this wide whatever the vocabulary


def policy_workload(wl: Workload) -> Workload:
    """The workload with per_device_batch in sequences: examples x the objective's graded sequences."""
    obj = objective(wl.objective, wl.loss_type)
    if obj.grad_sequences == 1:
        return wl
    return dataclasses.replace(wl, per_device_batch=wl.per_device_batch * obj.grad_sequences)


def compute_bytes(wl: Workload) -> int:
    """Bytes per element of the compute dtype: autocast's, else the weights'."""
    return 2 if wl.amp is not None else DTYPE_BYTES[wl.weight_dtype]


def reference_element_bytes(wl: Workload) -> int:
    """Bytes per parameter of the frozen reference (reference = copy). Full fine-tuning: the policy's
    dtype, as TRL 1.16 builds it (trl/trainer/dpo_trainer.py: the reference is loaded with
    dtype=self.model.dtype), so both run the same weights under the same autocast and the step-0
    rewards are 0. Beside adapters (a separate reference model): the compute dtype, as the frozen base."""
    return DTYPE_BYTES[wl.weight_dtype] if wl.adapters is None else compute_bytes(wl)


def reference_bytes(facts: ModelFacts, wl: Workload) -> tuple[int, int]:
    """(on the GPU, in host RAM) of the frozen reference copy's weights (reference = copy): every
    parameter in reference_element_bytes, on every GPU, except where TRL shards it with the policy.

    DeepSpeed ZeRO-3: trl/models/utils.py prepare_deepspeed initialises the reference with the
    policy's ZeRO config, keeping stage 3 ("If ZeRO-3 is used, we shard both the active and
    reference model"; other stages are set to 0, a full copy) and offload_param (only
    offload_optimizer is dropped), with stage3_param_persistence_threshold = 10 x hidden: each GPU
    holds its 1/N partition (padded to N equal parts) plus the parameters under that threshold,
    which stay gathered. Modules are gathered for their forward and released after it (the
    policy's forward gathers the same way, memory/sharding.py). The 16-bit partitions of an
    offloaded model live in host RAM.

    FSDP full_shard: trl prepare_fsdp fully_shards the reference with the policy's
    reshard_after_forward=True, so it is sharded too (1/N per GPU, a unit gathered at a time).
    Under shard_grad_op (reshard_after_forward=False) a forward without backward leaves each unit
    gathered (torch fsdp/_fully_shard/_fsdp_param_group.py reshard() returns in FORWARD when not
    resharding after forward, and no backward follows): the full copy, as counted."""
    if wl.reference != "copy":
        return 0, 0
    cb = reference_element_bytes(wl)
    n = max(wl.shard_world_size, 1)
    full = facts.n_params * cb
    if n > 1 and wl.zero_stage == 3 and wl.engine == "deepspeed":
        threshold = 10 * facts.hidden_size
        small = sum(math.prod(shape) for _, shape in facts.param_shapes if math.prod(shape) < threshold)
        part = -(-facts.n_params // n) * cb
        if wl.offload_params:
            return small * cb, part
        return part + small * cb, 0
    if n > 1 and wl.zero_stage == 3 and wl.engine == "fsdp":
        return -(-facts.n_params // n) * cb, 0
    return full, 0


def cpu_fold_bytes(facts: ModelFacts, n: int, cb: int, wb: int) -> int:
    """What the torch fallback of the backward fold allocates: a CPU has no Triton
    (chunked_logprob.py `_use_triton`: cuda / xpu only), so each [tokens x vocabulary] tile is
    folded by `_backward_tile` in torch ops, whose fp32 tiles are alive together at its
    `grad += grad_logprobs * (is_target.float() - p)` line: five held, y = tile.float() * logit_scale,
    z, log_p, p and grad, and that line's two temporaries (is_target.float() and the difference,
    then the difference and the product), plus the boolean is_target mask (tile.float() of a
    16-bit tile is freed with its product, before that line). The tile is the vocabulary chunk wide
    (at most VOCAB_CHUNK), not the buffer; `weight[start:end].to(compute_dtype)` copies the head's
    chunk when the weights are stored in another dtype."""
    rows, width = min(n, TOKEN_CHUNK), min(facts.vocab_size, VOCAB_CHUNK)
    fp32_tiles = 5 + 2
    return rows * width * (4 * fp32_tiles + 1) + (width * facts.hidden_size * cb if cb != wb else 0)


def fused_head_parts(facts: ModelFacts, wl: Workload, hidden_bytes: int) -> tuple[int, int]:
    """(loss path at the end of forward, at the start of backward) for TRL's fused head.

    `wl` counts sequences (policy_workload); `hidden_bytes`: the dtype of the backbone's output."""
    h, v = facts.hidden_size, facts.vocab_size
    n = wl.per_device_batch * (wl.seq_len - 1)  # positions scored (the last has no next token)
    cb = compute_bytes(wl)
    tile = min(n, TOKEN_CHUNK) * VOCAB_CHUNK * cb
    # saved for backward: flattened hidden (a copy: the [:, :-1] slice is not contiguous), int64
    # targets, log-sum-exp and entropy (fp32); the trainer's outputs: log-prob, entropy, mean logit
    # (fp32, masked copies) and the top-1 flag; the label mask (bool)
    # (grpo / rloo: log-prob and entropy only, grpo_trainer.py add_fused_lm_head outputs)
    outputs = 2 * 4 if wl.generation != "none" else 3 * 4 + 1
    saved = n * (h * hidden_bytes + 8 + 4 + 4 + outputs + 1)
    stats = n * (7 * 4 + 8 + 1)  # the seven running statistics, clamped targets, mask
    if wl.reference == "precomputed" or wl.generation != "none":
        # online RL computes the reference log-probs with the round, before the policy's step (memory/generation.py)
        forward = saved + tile + stats
    else:
        # the reference's forward: its last hidden state, its flattened copy, its tile and statistics
        ref_hidden = hidden_bytes if wl.reference == "adapters-off" else cb
        forward = saved + 2 * n * h * ref_hidden + tile + stats
    head_trains = wl.adapters is None
    backward = saved + tile + n * h * 4 + (v * h * 4 if head_trains else 0) + min(n, TOKEN_CHUNK) * h * cb
    wb = DTYPE_BYTES[wl.weight_dtype]
    if wl.device == "cpu":
        backward += cpu_fold_bytes(facts, n, cb, wb)
    if wb != 4:  # the fp32 accumulators are cast back to the 16-bit dtypes while still alive
        backward += n * h * wb + (v * h * wb if head_trains else 0)
    return forward, backward
