"""The FLOPs of a training step: N of the 6N term, model and hardware FLOPs per token, and the forwards
that run without gradients (a preference objective's reference and KL forwards). Pure arithmetic, no torch.

FLOPs per token, training (forward + backward):
- 6N for the matmul parameters N (2N forward, 4N backward): Kaplan et al. 2020,
  "Scaling Laws for Neural Language Models", section 2.1; Hoffmann et al. 2022
  (Chinchilla), appendix F.
- plus 12·L·H·Q·T for attention scores and values (L layers, H heads, Q head dim,
  T sequence length): Chowdhery et al. 2022 (PaLM), appendix B, "6N + 12LHQT".
  This counts the full T x T score matrix, as PaLM's MFU does, also for causal
  attention whose kernels skip the masked half.
- Full activation recomputation (gradient checkpointing of every decoder layer, as
  transformers does) runs each layer's forward twice: 8 instead of 6 per layer
  parameter and 16 instead of 12 for attention; the output head is not recomputed
  (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models": 96Bslh^2(1 + s/6h + V/16lh) hardware FLOPs with full recomputation vs
  72Bslh^2(1 + s/6h + V/12lh) model FLOPs).

N counts parameters that take part in a matmul: the input embedding is a lookup, so
vocab_size x hidden_size is taken off n_params unless it is tied to an output head
(causal-lm / masked-lm with tie_word_embeddings). Learned position embeddings
(GPT-2, BERT) are lookups too but are left in: under 1% of N for those models.
"""

from __future__ import annotations

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.methods import FULL, LORA
from gpuplan.spec.objectives import objective


def matmul_params(facts: ModelFacts) -> tuple[int, int]:
    """(parameters in matmuls, of which in the output head): N of the 6N term.

    For a mixture of experts N counts the active parameters: each token runs through
    its top-k experts only (Mixtral 8x7B: about 12.9B of 46.7B; Jiang et al. 2024,
    "Mixtral of Experts", section 2.1). Memory counts all of them (n_params)."""
    embedding = facts.vocab_size * facts.hidden_size
    n = facts.active_params
    if facts.vision is not None:  # a VLM's tower and projector run over image rows, not text tokens (step_time/tower_terms.py)
        n -= facts.vision.tower_params + facts.vision.projector_params
    has_lm_head = facts.task in ("causal-lm", "masked-lm")
    if not has_lm_head:
        return n - embedding, 0
    if facts.tie_word_embeddings:
        return n, embedding  # the one matrix is counted once, as the head
    return n - embedding, embedding  # n_params holds both matrices


def flops_per_token(facts: ModelFacts, seq_len: int, gradient_checkpointing: bool, frozen_base: bool = False) -> tuple[int, int]:
    """(model FLOPs, hardware FLOPs) per trained token; they differ by recomputation.

    frozen_base (LoRA/QLoRA): backward computes input gradients only, no weight
    gradients of the base: 2N + 2N instead of 2N + 4N (the adapters' r-wide matmuls
    are under 1% for r << hidden and left out)."""
    n, head = matmul_params(facts)
    attention = facts.num_layers * facts.num_attention_heads * facts.head_dim * seq_len
    weights = LORA.weight_flops if frozen_base else FULL.weight_flops
    model = weights * n + 12 * attention
    if not gradient_checkpointing:
        return model, model
    return model, (weights + 2) * (n - head) + weights * head + 16 * attention


def nograd_forward_flops(facts: ModelFacts, workload: Workload, tokens: int) -> tuple[int, int]:
    """(FLOPs of the step's forwards without gradients, FLOPs of the reference forwards when they are
    precomputed instead, per step). `tokens` are the policy's graded tokens per step. A forward is
    2N + 4LHQT per token, a third of training's 6N + 12LHQT (Kaplan et al. 2020; PaLM appendix B)."""
    obj = objective(workload.objective, workload.loss_type)
    if not obj.is_preference:
        return 0, 0
    n, _ = matmul_params(facts)
    forward = 2 * n + 4 * facts.num_layers * facts.num_attention_heads * facts.head_dim * workload.seq_len
    per_graded = tokens // obj.grad_sequences  # tokens of one sequence per example
    reference = obj.reference_sequences * per_graded * forward
    policy = obj.nograd_policy_sequences * per_graded * forward
    if workload.reference == "precomputed":
        return policy, reference
    return policy + reference, 0
