"""Memory to serve a model: weights, the KV cache for a context, one forward's working set.

Pure, no torch; the same facts (modelinfo), dtype sizes (memory/states.py DTYPE_BYTES)
and CUDA overhead (memory/overhead.py) as the training estimate. For one device,
`batch` sequences of `context` tokens each:
  weights       n_params x bytes per weight (tied embeddings counted once, as modelinfo counts)
  kv_cache      2 (keys and values) x layers x KV heads x head_dim x context x batch x bytes:
                what a decoder caches per token (Kwon et al. 2023, "Efficient Memory
                Management for LLM Serving with PagedAttention", section 2.2; grouped-query
                attention caches only the KV heads, Ainslie et al. 2023)
  activations   the prefill of the whole context through one layer at a time (layers run
                one after another, so one layer's tensors are live): the residual and norm
                output (2h), q, k, v and the attention output (2ad + 2kvd), the gated MLP's
                gate, up and product (3i; a plain MLP: 2i), plus the logits of the last
                position in fp32 (transformers generate computes logits_to_keep = 1)
  overhead      CUDA context, cuBLAS workspace, allocator reserve (memory/overhead.py)
Serving engines add their own policy on top: vLLM preallocates a share of the GPU
(gpu_memory_utilization, 0.9 by default) and fills what weights leave with KV blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.overhead import overhead_bytes
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES


@dataclass(frozen=True)
class InferenceMemory:
    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    overhead_bytes: int
    context: int
    batch: int
    dtype: str

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.overhead_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_cache_bytes // max(self.context * self.batch, 1)

    def to_dict(self) -> dict[str, int | str]:
        return {
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "activation_bytes": self.activation_bytes,
            "overhead_bytes": self.overhead_bytes,
            "total_bytes": self.total_bytes,
            "context": self.context,
            "batch": self.batch,
            "dtype": self.dtype,
        }


def inference_memory(
    facts: ModelFacts, *, dtype: str, context: int, batch: int = 1, device: str = "cuda", compute_capability: tuple[int, int] | None = None
) -> InferenceMemory:
    b = DTYPE_BYTES[dtype]
    h, a, kv, d, i = (facts.hidden_size, facts.num_attention_heads, facts.num_key_value_heads, facts.head_dim, facts.intermediate_size)
    tokens = context * batch
    weights = facts.n_params * b
    kv_cache = 2 * facts.num_layers * kv * d * tokens * b
    mlp = 3 * i if facts.mlp == "gated" else 2 * i
    activations = tokens * (2 * h + 2 * a * d + 2 * kv * d + mlp) * b + batch * facts.vocab_size * 4
    allocated = weights + kv_cache + activations
    return InferenceMemory(weights, kv_cache, activations, overhead_bytes(allocated, device, compute_capability), context, batch, dtype)
