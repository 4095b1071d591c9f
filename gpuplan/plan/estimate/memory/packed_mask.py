"""What packed examples cost under SDPA: transformers' (b, 1, s, s) mask and the kernel it forces.

Packed chat / instruction examples restart their position ids (apply/data/examples.py), so
transformers 5.24 masking_utils.create_causal_mask finds packed sequences
(find_packed_sequence_indices) and materializes a (b, 1, s, s) boolean mask
(sdpa_mask with packed_sequence_mask_function, masking_utils.py:991-1002) instead of
SDPA's is_causal path. With an explicit mask, CUDA's SDPA cannot run flash attention
(sdp_utils.cpp check_for_attn_mask) and runs the memory-efficient kernel, which:
- gets the boolean mask as a float bias of the query dtype (convert_boolean_attn_mask) and
  saves it for backward: b*s*s x (2 or 4) bytes per layer;
- gets grouped-query k and v repeated to all heads, as trace/cuda_ops.py models it, saved
  for backward: 2 x (a - kv) x d x (2 bytes) more per token than flash's kv heads (the fp32
  rows run the memory-efficient kernel already).
Checkpointed layers keep their arguments for the recomputation: the boolean mask
(b*s*s bytes) then stays alive through backward.
Measured against the trace of packed batches (trace/__init__.py _unpacked_sequences): per
layer exactly these bytes over batch 1-2, seq 128-256 and 1-3 layers (Llama, GQA 6:2).
flash_attention_2 reads the position ids as varlen boundaries and builds no mask;
eager attention builds a (b, 1, s, s) mask packed or not: no change for either.
"""

from __future__ import annotations

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.types import Workload


def packs_with_mask(wl: Workload) -> bool:
    return wl.packed and wl.attn_implementation == "sdpa"


def packed_mask_layer_bytes(facts: ModelFacts, wl: Workload, sixteen_bit: bool) -> int:
    """Bytes one layer keeps for backward because of the packed mask (0 when not packed under SDPA)."""
    if not packs_with_mask(wl):
        return 0
    b, s = wl.per_device_batch, wl.seq_len
    elt = 2 if sixteen_bit else 4
    out = b * s * s * elt
    a, kv, d = facts.num_attention_heads, facts.num_key_value_heads, facts.head_dim
    if sixteen_bit and d <= 256 and kv < a:  # flash would have run on the kv heads
        out += b * s * 2 * (a - kv) * d * elt
    return out


def packed_mask_outside_bytes(wl: Workload) -> int:
    """The boolean mask kept through backward as checkpointed layers' argument."""
    if not packs_with_mask(wl) or not wl.gradient_checkpointing:
        return 0
    return wl.per_device_batch * wl.seq_len * wl.seq_len
