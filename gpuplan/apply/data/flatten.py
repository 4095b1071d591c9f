"""Packed examples under flash_attention_2: each micro-batch flattened into one row.

transformers 5.24 runs flash_attention_2 on varlen sequences (cu_seqlens built from
position ids that restart per example) only when the batch has one row:
modeling_flash_attention_utils._is_packed_sequence returns False for batch_size != 1,
and masking_utils' flash mask ignores the packing mask function. With B > 1 rows every
block would be one causal sequence, so its packed examples would attend to each other.
The collator below lays the B packed blocks of a micro-batch end to end into a (1, B x
seq_len) row, the scheme of transformers' DataCollatorWithFlattening: position ids still
restart at every example (and at each block's padding tail), and every example's first
label is already -100 (examples.py), so no token is predicted across a boundary. The
tokens per step, and so the plan's throughput and memory, are unchanged.
"""

from __future__ import annotations

from typing import Any

FLATTENED_KERNELS = frozenset({"flash_attention_2"})  # kernels that keep examples apart only in one row
KEYS = ("input_ids", "labels", "position_ids")


def needs_flattening(attn_implementation: str | None, packing: bool) -> bool:
    return bool(packing) and attn_implementation in FLATTENED_KERNELS


def flatten_micro_batch(features: list[dict[str, Any]]) -> dict[str, Any]:
    """default_data_collator's (B, S) tensors of packed blocks, reshaped to one (1, B x S) row."""
    from transformers import default_data_collator

    batch = default_data_collator([{k: f[k] for k in KEYS} for f in features])
    return {k: v.reshape(1, -1) for k, v in batch.items()}
