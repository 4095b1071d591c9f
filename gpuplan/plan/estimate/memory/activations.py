"""Activations and the loss path: bytes autograd keeps for backward.

Pure functions over ModelFacts and Workload. Per layer and per token, the bytes are
c_h*h + c_q*(a*d) + c_kv*(kv*d) + c_i*i + c_a*a + c_1 (+ c_as*a*s for eager
attention), counted from the tensors each transformers block saves for backward
(listed per style below) and confirmed exactly (integer coefficients, zero
residual) against the fake-tensor trace of one- and two-layer models of each
family at several widths (benchmarks/memory_coefficients.py re-derives any row;
tests/trace/test_memory_vs_trace.py and benchmarks/memory_accuracy.py check the whole).

Modes: "fp32" (fp32 weights, no autocast), "half" (weights loaded in bf16/fp16),
"amp" (fp32 weights under autocast fp16/bf16: residual stream and norms stay
fp32, every linear casts its input, weights are cast once per forward and cached).
SDPA: flash for 16-bit inputs (keeps output + fp32 log-sum-exp per row and head),
memory-efficient for fp32 (the same, but grouped-query k/v repeated to all heads),
as torch's CUDA sdp_utils.cpp chooses; eager keeps the (b, a, s, s) fp32 softmax
output (and its 16-bit copy) per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.liger import flce_bytes
from gpuplan.plan.estimate.memory.loss_chunking import loss_tokens
from gpuplan.plan.estimate.memory.packed_mask import packed_mask_layer_bytes, packed_mask_outside_bytes
from gpuplan.plan.estimate.memory.types import Workload

# model_type -> block style
STYLE_OF = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "mixtral": "llama",  # llama's attention and norms; its MoE block: moe_extra_per_token
    "gemma": "gemma",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "bert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "opt": "opt",
    "phi": "phi",
    # vision-language models: the language model's block (Qwen2 / Llama layers)
    "qwen2_vl": "llama",
    "qwen2_5_vl": "llama",
    "llava": "llama",
    "llava_next": "llama",
    "idefics3": "llama",
    "smolvlm": "llama",
    "mllama": "llama",  # MllamaSelfAttentionDecoderLayer; its cross-attention layers: memory/vision.py
}

# (style, mode) -> per-token bytes one layer keeps with SDPA: (c_h, c_q, c_kv, c_i, c_a, c_1).
# Each row was counted from the block's code and matches the trace exactly (fit over
# 7 width variants x 2 sequence lengths, integer coefficients, zero residual).
# llama (modeling_llama.py LlamaDecoderLayer):
#   fp32: per RMSNorm its input x, x*rsqrt, weight*(.), rsqrt (2 x (3*4h + 4));
#         q after rope, k and v repeated to all heads for the memory-efficient kernel,
#         output (4 x 4*a*d); fp32 log-sum-exp (4a); gate, silu(gate), up, product (4 x 4i).
#   half: per norm x.float() (4h), rsqrt, (.).to(half) (2h), weight*(.) (2h); q, k after
#         rope, v, output (2*(2ad + 2kvd)); lse 4a; 4 x 2i.
#   amp:  per norm x (fp32 4h), rsqrt, x*rsqrt (4h); a 16-bit copy of the norm output per
#         consuming linear (q, k, v: 3 x 2h; gate, up: 2 x 2h); attention and MLP as half.
# gemma (modeling_gemma.py): llama's block; its norm keeps fp32 x*rsqrt and (1 + w) in
#   half (+4h), GELU-tanh keeps its input like SiLU; + 8h bytes per layer for (1 + w).
# gpt2 (modeling_gpt2.py GPT2Block, dropout 0.1, q = kv = h so attention folds into c_h):
#   fp32: ln_1/ln_2 outputs (2 x 4h) + mean/rstd (16); c_attn output q,k,v (12h); attention
#         output (4h); two residual dropout masks (2 x 1h bool) and residual sums (2 x 4h);
#         c_fc output + gelu_new's mul, pow/tanh, add terms (5 x 4i); lse 4a.
# gpt_neox (modeling_gpt_neox.py, parallel residual, no dropout): fp32 36h = two LN outputs,
#   qkv (12h), q/k after partial rotary (8h), attention output (4h), layer input and sums;
#   dense_h_to_4h output and GELU (2 x 4i).
# bert (modeling_bert.py BertLayer, post-LN, dropout 0.1): fp32 34h, 2 x 4i.
# opt (modeling_opt.py OPTDecoderLayer, pre-LN, dropout 0.1, ReLU keeps only its output):
#   fp32 34h, 1 x 4i.
# phi (modeling_phi.py PhiDecoderLayer, one LN, parallel attention + MLP, gelu_new, half
#   rotary, no dropout): fp32 24h, gelu_new's terms 5 x 4i.
# amp rows of gpt2 and phi (gelu_new) follow CUDA autocast: pow is on its float32 list
#   (reference/cuda-autocast.md), so x**3 and every term after it (tanh's output, 1 + tanh,
#   the product) are fp32 beside the 16-bit fc output and its 16-bit copy for the next
#   linear: c_i 16, not the 10 of CPU autocast (re-fit by benchmarks/memory_coefficients.py
#   under trace/cuda_autocast.py: c_i 15.98, as the other coefficients before).
# (The amp rows of the LayerNorm families were confirmed per token by hand count; their
# fit shows only a per-layer constant of a few hundred bytes from the bias casts.)
_SDPA = {
    ("llama", "fp32"): (24, 16, 0, 16, 4, 8),
    ("llama", "half"): (16, 4, 4, 8, 4, 8),
    ("llama", "amp"): (26, 4, 4, 8, 4, 8),
    ("gemma", "fp32"): (24, 16, 0, 16, 4, 8),
    ("gemma", "half"): (20, 4, 4, 8, 4, 8),
    ("gemma", "amp"): (26, 4, 4, 8, 4, 8),
    ("gpt2", "fp32"): (34, 0, 0, 20, 4, 16),
    ("gpt2", "half"): (18, 0, 0, 10, 4, 8),
    ("gpt2", "amp"): (22, 0, 0, 16, 4, 16),
    ("gpt_neox", "fp32"): (36, 0, 0, 8, 4, 16),
    ("gpt_neox", "half"): (20, 0, 0, 4, 4, 8),
    ("gpt_neox", "amp"): (22, 0, 0, 4, 4, 16),
    ("bert", "fp32"): (34, 0, 0, 8, 4, 16),
    ("bert", "half"): (18, 0, 0, 4, 4, 8),
    ("bert", "amp"): (26, 0, 0, 4, 4, 16),
    ("opt", "fp32"): (34, 0, 0, 4, 4, 16),
    ("opt", "half"): (18, 0, 0, 2, 4, 8),
    ("opt", "amp"): (26, 0, 0, 2, 4, 16),
    ("phi", "fp32"): (24, 0, 0, 20, 4, 8),
    ("phi", "half"): (14, 0, 0, 10, 4, 4),
    ("phi", "amp"): (22, 0, 0, 16, 4, 8),
}
# Eager attention, change per token against SDPA: (d_q, d_kv, d_a, c_as). It keeps q,
# repeat_kv(k), repeat_kv(v) (all heads) and the (a, s) softmax row per token: fp32 (4)
# plus its 16-bit copy (2) when half; with attention dropout also the bool mask (1) and
# the dropped probabilities; no log-sum-exp (-4a). Measured by the same fit. BERT's softmax
# takes no dtype: under CUDA autocast (float32 list) its output is fp32 as GPT-2's, c_as 7.
_EAGER = {
    ("llama", "fp32"): (0, 0, -4, 4),
    ("llama", "half"): (4, -4, -4, 6),
    ("llama", "amp"): (4, -4, -4, 6),
    ("gemma", "fp32"): (0, 0, -4, 4),
    ("gemma", "half"): (4, -4, -4, 6),
    ("gemma", "amp"): (4, -4, -4, 6),
    ("gpt2", "fp32"): (0, 0, -4, 9),
    ("gpt2", "half"): (0, 0, -4, 5),
    ("gpt2", "amp"): (0, 0, -4, 7),
    ("bert", "fp32"): (0, 0, -4, 9),
    ("bert", "half"): (0, 0, -4, 5),
    ("bert", "amp"): (0, 0, -4, 7),
    ("gpt_neox", "fp32"): (0, 0, -4, 4),
    ("gpt_neox", "half"): (0, 0, -4, 6),
    ("gpt_neox", "amp"): (0, 0, -4, 6),
    ("opt", "fp32"): (0, 0, -4, 4),
    ("opt", "half"): (0, 0, -4, 6),
    ("opt", "amp"): (0, 0, -4, 6),
    ("phi", "fp32"): (0, 0, -4, 4),
    ("phi", "half"): (0, 0, -4, 6),
    ("phi", "amp"): (0, 0, -4, 6),
}
# Outside the layers, per token: (n_h, n_d, n_1): embedding output (layer 0's input),
# final norm, rotary cos/sin (2 x d per token; gpt_neox rotates a quarter of d),
# position ids (int64) and dropout masks of gpt2/bert/opt embeddings; phi rotates half of
# d, gpt_neox a quarter. Measured by the same fit.
_OUTSIDE = {
    ("llama", "fp32"): (12, 8, 4),
    ("llama", "half"): (8, 4, 4),
    ("llama", "amp"): (8, 8, 4),
    ("gemma", "fp32"): (12, 8, 4),
    ("gemma", "half"): (10, 4, 4),
    ("gemma", "amp"): (8, 8, 4),
    ("gpt2", "fp32"): (9, 0, 16),
    ("gpt2", "half"): (5, 0, 12),
    ("gpt2", "amp"): (5, 0, 16),
    ("bert", "fp32"): (9, 0, 16),
    ("bert", "half"): (5, 0, 12),
    ("bert", "amp"): (5, 0, 16),
    ("gpt_neox", "fp32"): (8, 2, 8),
    ("gpt_neox", "half"): (4, 1, 4),
    ("gpt_neox", "amp"): (4, 2, 8),
    ("opt", "fp32"): (8, 0, 16),
    ("opt", "half"): (4, 0, 12),
    ("opt", "amp"): (4, 0, 16),
    ("phi", "fp32"): (8, 4, 8),
    ("phi", "half"): (4, 2, 4),
    ("phi", "amp"): (4, 4, 8),
}
_PER_LAYER_CONST_H = {"gemma": 8}  # bytes per layer per hidden unit: gemma's fp32 (1 + w) per norm
_DROPOUT_STYLES = {"gpt2": 2, "bert": 2, "opt": 2}
_GELU_NEW_STYLES = {"gpt2", "phi"}  # pow inside gelu_new: fp32 under CUDA autocast
# Their _EAGER rows were measured with attention dropout 0.1; residual dropouts per layer
# whose bool masks are in c_h.
_EAGER_WITH_ATTN_DROPOUT = {"gpt2", "bert"}


def moe_extra_per_token(facts: ModelFacts, mode: str, c_i: int) -> int:
    """Bytes one MoE layer keeps per token beyond the dense gated MLP of the same width.

    transformers 5.24 MixtralSparseMoeBlock: a router (linear to E logits, fp32 softmax,
    top-k) and, per routed (token, expert) pair, the gathered input, the expert's gated
    MLP activations and the expert output scaled by its routing weight. Fitted exactly
    (zero residual, 10 variants of E, k, h, i, bf16 weights) as the trace of Mixtral minus
    the trace of the same-width Llama: 8i(k-1) + 4hk + 4E + 40k + 4. fp32/AMP rows are the
    same count in their dtypes, not traced (the fake-tensor grouped_mm takes bf16 only).
    """
    e, k = facts.num_experts, facts.experts_per_token
    h, i = facts.hidden_size, facts.intermediate_size
    per_pair_h = 4 if mode == "half" else 8  # gathered input + scaled expert output
    return c_i * i * (k - 1) + per_pair_h * h * k + 4 * e + 40 * k + 4


@dataclass(frozen=True)
class ActivationParts:
    per_layer: int  # bytes one layer keeps for backward (no checkpointing)
    per_layer_checkpointed: int  # bytes one checkpointed layer keeps (its input)
    outside_layers: int  # embeddings, rotary tables, final norm, attention mask
    logits_fwd: int  # loss path at the end of forward
    logits_bwd_start: int  # loss path at the start of backward (its peak)
    layer_backward: int  # transient gradients inside one layer's backward (MLP)
    note: str | None = None


def mode_of(wl: Workload) -> str:
    if wl.weight_dtype != "float32":
        return "half"
    if wl.amp is not None and wl.engine in ("fsdp", "deepspeed"):
        # the forward runs on 16-bit parameters: FSDP MixedPrecisionPolicy(param_dtype) gathers
        # them, DeepSpeed casts the module (memory/sharding.py): activations as in pure 16-bit
        return "half"
    return "amp" if wl.amp is not None else "fp32"


def activation_parts(facts: ModelFacts, wl: Workload) -> ActivationParts:
    note = None
    style = STYLE_OF.get(facts.model_type)
    if style is None:
        note = f"no activation model for model_type {facts.model_type!r}; estimated with the Llama block (RMSNorm, gated MLP, rotary)"
        style = "llama"
    mode = mode_of(wl)
    b, s = wl.per_device_batch, wl.seq_len
    tokens = b * s
    h, i = facts.hidden_size, facts.intermediate_size
    a, kv, d = facts.num_attention_heads, facts.num_key_value_heads, facts.head_dim
    # 16-bit weights under autocast: CUDA autocast runs layer_norm (and gelu_new's pow) in fp32,
    # so the LayerNorm families keep the amp rows' activations (fitted by benchmarks/
    # memory_coefficients.py MODE half-amp: gpt2, opt, phi, bert equal their amp rows, gpt_neox
    # keeps 4h more); the RMSNorm families cast explicitly and keep their half rows
    rows = "amp" if mode == "half" and wl.amp is not None and style not in ("llama", "gemma") else mode
    c_h, c_q, c_kv, c_i, c_a, c_1 = _SDPA[(style, rows)]
    if rows != mode and style == "gpt_neox":
        c_h += 4
    c_as = 0
    if wl.attn_implementation == "eager":
        d_q, d_kv, d_a, c_as = _EAGER[(style, rows)]
        c_q, c_kv, c_a = c_q + d_q, c_kv + d_kv, c_a + d_a
        dropped = 1 + (4 if mode == "fp32" else 2)  # bool mask + the dropped probabilities
        if style in _EAGER_WITH_ATTN_DROPOUT and facts.attention_dropout == 0:
            c_as -= dropped
        elif style not in _EAGER_WITH_ATTN_DROPOUT and facts.attention_dropout > 0:
            c_as += dropped
    if style in _DROPOUT_STYLES and facts.hidden_dropout == 0:
        c_h -= _DROPOUT_STYLES[style]  # no residual dropout masks (1 byte per element each)
    per_token = c_h * h + c_q * a * d + c_kv * kv * d + c_i * i + c_a * a + c_1 + c_as * a * s
    if facts.num_experts:
        per_token += moe_extra_per_token(facts, mode, c_i)
    per_layer = tokens * per_token + _PER_LAYER_CONST_H.get(style, 0) * h
    per_layer += packed_mask_layer_bytes(facts, wl, mode != "fp32")  # packed examples under SDPA
    resid = 2 if mode == "half" else 4  # the residual stream's dtype
    # checkpoint(layer) keeps the layer input only (measured: 4h fp32 per token)
    per_layer_ckpt = tokens * h * resid
    n_h, n_d, n_1 = _OUTSIDE[(style, rows)]
    if style in _DROPOUT_STYLES and facts.hidden_dropout == 0:
        n_h -= 1
    outside = tokens * (n_h * h + n_d * d + n_1)
    if wl.gradient_checkpointing:
        outside += tokens * 8  # int64 positions the checkpointed calls keep
    outside += packed_mask_outside_bytes(wl)
    half = 4 if mode == "fp32" else 2
    # chunked cross-entropy keeps the loss path of one chunk of tokens at a time
    lt = loss_tokens(tokens, wl.loss_chunk_size)
    if wl.task == "seq-cls":
        logits_fwd = logits_bwd = 0
    else:
        v = facts.vocab_size
        # loss/loss_utils.py ForCausalLMLoss/ForMaskedLMLoss: logits.float() then
        # cross_entropy = log_softmax (kept, fp32) + nll_loss. End of forward: logits
        # (compute dtype) + fp32 copy (if 16-bit) + log_softmax. Start of backward: the
        # log_softmax output, nll_loss's gradient and log_softmax's gradient, 3 x fp32.
        if style == "bert":
            # BertForMaskedLM calls CrossEntropyLoss on the logits as they are (no
            # .float()): in 16-bit weights log_softmax and its gradients stay 16-bit;
            # under autocast cross_entropy runs in fp32 (autocast fp32 op list)
            e = 4 if rows != "half" else 2
            logits_fwd = lt * v * (half + (4 if rows == "amp" else 0) + e)
            logits_bwd = lt * v * 3 * e
            if rows == "amp":
                # CUDA autocast has no cross_entropy_loss kernel: it decomposes to log_softmax
                # (float32 by dtype=) and nll_loss; the trace under CUDA's policy keeps 10
                # bytes per logit at the start of backward, not CPU autocast's 12 (measured:
                # traced logits_loss over vocab_size 4000 -> 8000 at 512 and 2048 tokens,
                # BERT h=256: 10 per logit + the head's 16-bit decoder weight copy, 2hv)
                logits_bwd = lt * v * 10
        else:
            logits_fwd = lt * v * (half + (4 if half == 2 else 0) + 4)
            logits_bwd = lt * v * 12
        if wl.liger_kernel and wl.task == "causal-lm":
            # Liger's fused linear cross-entropy (memory/liger.py): one chunk's logits in forward,
            # the input's and the head's gradients held from forward to backward
            frozen = wl.adapters is not None and "lm_head" not in wl.adapters.modules_to_save
            head_bytes = 0 if frozen else (4 if wl.weight_dtype == "float32" else 2)
            logits_fwd, logits_bwd = flce_bytes(tokens, h, v, half, head_bytes)
        if wl.task == "masked-lm":
            # BERT's prediction transform (dense, GELU, LayerNorm) before the decoder
            outside += tokens * h * 3 * half
        if wl.objective != "sft":  # TRL's fused log-prob head, not logits + cross-entropy
            from gpuplan.plan.estimate.memory.preference import fused_head_parts

            logits_fwd, logits_bwd = fused_head_parts(facts, wl, resid)
    # Inside one layer's backward the MLP's input gradients coexist: gated MLP (act*up)
    # backward holds grad of the product input, of act and of up (3 x b*s*i); a plain
    # MLP holds two. Counted from the autograd graph; confirmed where this moment is the
    # peak (sequence classification, no vocabulary-sized loss).
    layer_backward = tokens * i * half * (3 if facts.mlp == "gated" else 2)
    if style in _GELU_NEW_STYLES and rows == "amp":
        # gelu_new under CUDA autocast: the gradients of its fp32 terms (pow, tanh, 1 + tanh,
        # the product) coexist at the MLP's backward peak: 12 bytes per token per intermediate
        # unit, less the 16-bit copy of its output that c_fc2/c_proj's backward has consumed
        # by then (2). Measured: traced peak slope over intermediate_size 1024 -> 2048 (GPT-2
        # h=256, checkpointed, seq-cls, where this moment is the peak): 33.8 bytes per token
        # per unit, 27.5 before this term.
        layer_backward = tokens * i * 10
    return ActivationParts(per_layer, per_layer_ckpt, outside, logits_fwd, logits_bwd, layer_backward, note)
