"""What a preference objective (DPO, KTO) adds to a step's memory, part by part.

The objective's descriptor (plan/objectives.py) says how many sequences an example puts
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

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.objectives import objective

TOKEN_CHUNK = 4096  # kernels/chunked_logprob.py TOKEN_CHUNK_SIZE
VOCAB_CHUNK = 32768  # trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: the buffer is this wide whatever the vocabulary


def policy_workload(wl: Workload) -> Workload:
    """The workload with per_device_batch in sequences: examples x the objective's graded sequences."""
    obj = objective(wl.objective)
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


def reference_bytes(facts: ModelFacts, wl: Workload) -> int:
    """The frozen reference copy's weights (reference = copy)."""
    return facts.n_params * reference_element_bytes(wl) if wl.reference == "copy" else 0


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
    saved = n * (h * hidden_bytes + 8 + 4 + 4 + 3 * 4 + 1 + 1)
    stats = n * (7 * 4 + 8 + 1)  # the seven running statistics, clamped targets, mask
    if wl.reference == "precomputed":
        forward = saved + tile + stats
    else:
        # the reference's forward: its last hidden state, its flattened copy, its tile and statistics
        ref_hidden = hidden_bytes if wl.reference == "adapters-off" else cb
        forward = saved + 2 * n * h * ref_hidden + tile + stats
    head_trains = wl.adapters is None
    backward = saved + tile + n * h * 4 + (v * h * 4 if head_trains else 0) + min(n, TOKEN_CHUNK) * h * cb
    wb = DTYPE_BYTES[wl.weight_dtype]
    if wb != 4:  # the fp32 accumulators are cast back to the 16-bit dtypes while still alive
        backward += n * h * wb + (v * h * wb if head_trains else 0)
    return forward, backward
