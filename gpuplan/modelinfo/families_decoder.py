"""Parameter tensors of the llama-like decoder families, without torch.

Each layout below is read from transformers 5.24's modeling_<family>.py
(the __init__ of <F>Attention, <F>MLP, <F>DecoderLayer, <F>Model,
<F>ForCausalLM); names and registration order match model.named_parameters().
Sequence classification is GenericForSequenceClassification
(transformers/modeling_layers.py): the base model under "model" plus
score = nn.Linear(hidden, num_labels, bias=False).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.modelinfo.defaults import FamilyConfig, check_divides
from gpuplan.modelinfo.params import Dims, ParamList

DECODER_TASKS = ("causal-lm", "seq-cls")

# Per family: which Linear layers carry a bias and which extra norms exist.
#   qkv_bias / o_bias: True, False, or "attention_bias" (read that config flag)
#   mlp_bias: True, False, or "mlp_bias"
#   qk_norm: Qwen3 RMSNorm(head_dim) on q and k (modeling_qwen3.py Qwen3Attention)
#   sandwich: Gemma2 pre/post_feedforward_layernorm (modeling_gemma2.py)
#   moe: Mixtral sparse MoE block (modeling_mixtral.py): router mlp.gate.weight
#        (experts, hidden) and fused experts.gate_up_proj (experts, 2 * inter, hidden),
#        experts.down_proj (experts, hidden, inter), bare nn.Parameters
_STYLES: dict[str, dict[str, Any]] = {
    "llama": {"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": "mlp_bias"},
    "mistral": {"qkv_bias": False, "o_bias": False, "mlp_bias": False},
    "qwen2": {"qkv_bias": True, "o_bias": False, "mlp_bias": False},
    "qwen3": {"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False, "qk_norm": True},
    "gemma": {"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False},
    "gemma2": {"qkv_bias": "attention_bias", "o_bias": "attention_bias", "mlp_bias": False, "sandwich": True},
    "mixtral": {"qkv_bias": False, "o_bias": False, "mlp_bias": False, "moe": True},
}
LLAMA_LIKE = tuple(_STYLES)


def _flag(cfg: FamilyConfig, spec: bool | str) -> bool:
    return cfg.bool(spec) if isinstance(spec, str) else spec


def _common_dims(cfg: FamilyConfig) -> dict[str, Any]:
    hidden = cfg.int("hidden_size")
    heads = cfg.int("num_attention_heads")
    # num_key_value_heads None -> num_attention_heads (<F>Config.__post_init__)
    kv = cfg.int_or_none("num_key_value_heads") or heads
    # head_dim None -> hidden // heads (LlamaConfig.__post_init__, and the
    # getattr(config, "head_dim", hidden // heads) in every <F>Attention)
    head_dim = cfg.int_or_none("head_dim")
    if head_dim is None:
        head_dim = hidden // heads
        check_divides(cfg, "hidden_size", "num_attention_heads")
    check_divides(cfg, "num_attention_heads", "num_key_value_heads", heads, kv)
    return {
        "hidden_size": hidden,
        "num_layers": cfg.int("num_hidden_layers", minimum=0),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": cfg.int("intermediate_size"),
        "vocab_size": cfg.int("vocab_size"),
        "max_position_embeddings": cfg.int("max_position_embeddings"),
        "tie_word_embeddings": cfg.bool("tie_word_embeddings"),
        "attention_dropout": cfg.float("attention_dropout"),
    }


def _head(p: ParamList, d: Dims, task: str, num_labels: int, lm_bias: bool) -> None:
    if task == "seq-cls":
        p.linear("score", d.hidden_size, num_labels, bias=False)
        return
    # <F>ForCausalLM: lm_head = nn.Linear(hidden, vocab); _tied_weights_keys ties
    # lm_head.weight to model.embed_tokens.weight when tie_word_embeddings.
    if not d.tie_word_embeddings:
        p.add("lm_head.weight", d.vocab_size, d.hidden_size)
    if lm_bias:
        p.add("lm_head.bias", d.vocab_size)


def count_llama_like(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """llama, mistral, qwen2, qwen3, gemma, gemma2, mixtral (separate q/k/v, gated MLP
    or gated experts, RMSNorm)."""
    style = _STYLES[model_type]
    cfg = FamilyConfig(model_type, config)
    d = Dims(**_common_dims(cfg), mlp="gated", norm="rmsnorm", hidden_dropout=0.0)
    qkv_bias, o_bias = _flag(cfg, style["qkv_bias"]), _flag(cfg, style["o_bias"])
    mlp_bias = _flag(cfg, style["mlp_bias"])
    h, hd, i = d.hidden_size, d.head_dim, d.intermediate_size
    p = ParamList()
    if style.get("moe"):
        p.experts = {"num_experts": cfg.int("num_local_experts"), "experts_per_token": cfg.int("num_experts_per_tok")}
        p.notes.append(
            f"mixture of experts: {cfg.int('num_local_experts')} experts per layer, "
            f"{cfg.int('num_experts_per_tok')} active per token; n_params counts all"
        )
    p.embedding("model.embed_tokens", d.vocab_size, h)
    for n in range(d.num_layers):
        a, m = f"model.layers.{n}.self_attn", f"model.layers.{n}.mlp"
        p.linear(f"{a}.q_proj", h, d.num_attention_heads * hd, qkv_bias)
        p.linear(f"{a}.k_proj", h, d.num_key_value_heads * hd, qkv_bias)
        p.linear(f"{a}.v_proj", h, d.num_key_value_heads * hd, qkv_bias)
        p.linear(f"{a}.o_proj", d.num_attention_heads * hd, h, o_bias)
        if style.get("qk_norm"):
            p.norm(f"{a}.q_norm", hd, bias=False)
            p.norm(f"{a}.k_norm", hd, bias=False)
        if style.get("moe"):
            experts = cfg.int("num_local_experts")
            p.add(f"{m}.gate.weight", experts, h)
            p.add(f"{m}.experts.gate_up_proj", experts, 2 * i, h)
            p.add(f"{m}.experts.down_proj", experts, h, i)
        else:
            p.linear(f"{m}.gate_proj", h, i, mlp_bias)
            p.linear(f"{m}.up_proj", h, i, mlp_bias)
            p.linear(f"{m}.down_proj", i, h, mlp_bias)
        norms = ["input_layernorm", "post_attention_layernorm"]
        if style.get("sandwich"):
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        for norm in norms:
            p.norm(f"model.layers.{n}.{norm}", h, bias=False)
    p.norm("model.norm", h, bias=False)
    _head(p, d, task, num_labels, lm_bias=False)
    return p, d


def count_phi3(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """phi3: fused qkv_proj and gate_up_proj, no biases (modeling_phi3.py)."""
    cfg = FamilyConfig(model_type, config)
    d = Dims(**_common_dims(cfg), mlp="gated", norm="rmsnorm", hidden_dropout=cfg.float("resid_pdrop"))
    h, hd, i = d.hidden_size, d.head_dim, d.intermediate_size
    qkv_out = d.num_attention_heads * hd + 2 * d.num_key_value_heads * hd  # Phi3Attention op_size
    p = ParamList()
    p.embedding("model.embed_tokens", d.vocab_size, h)
    for n in range(d.num_layers):
        a, m = f"model.layers.{n}.self_attn", f"model.layers.{n}.mlp"
        p.linear(f"{a}.o_proj", d.num_attention_heads * hd, h, bias=False)
        p.linear(f"{a}.qkv_proj", h, qkv_out, bias=False)
        p.linear(f"{m}.gate_up_proj", h, 2 * i, bias=False)
        p.linear(f"{m}.down_proj", i, h, bias=False)
        p.norm(f"model.layers.{n}.input_layernorm", h, bias=False)
        p.norm(f"model.layers.{n}.post_attention_layernorm", h, bias=False)
    p.norm("model.norm", h, bias=False)
    _head(p, d, task, num_labels, lm_bias=False)
    return p, d


def count_phi(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """phi (phi-1/1.5/2): biases everywhere, one LayerNorm per parallel block,
    plain fc1/fc2 MLP, lm_head with bias (modeling_phi.py)."""
    cfg = FamilyConfig(model_type, config)
    d = Dims(**_common_dims(cfg), mlp="plain", norm="layernorm", hidden_dropout=cfg.float("resid_pdrop"))
    h, hd, i = d.hidden_size, d.head_dim, d.intermediate_size
    p = ParamList()
    p.embedding("model.embed_tokens", d.vocab_size, h)
    for n in range(d.num_layers):
        a, m = f"model.layers.{n}.self_attn", f"model.layers.{n}.mlp"
        p.linear(f"{a}.q_proj", h, d.num_attention_heads * hd, bias=True)
        p.linear(f"{a}.k_proj", h, d.num_key_value_heads * hd, bias=True)
        p.linear(f"{a}.v_proj", h, d.num_key_value_heads * hd, bias=True)
        p.linear(f"{a}.dense", d.num_attention_heads * hd, h, bias=True)
        if cfg.bool("qk_layernorm"):
            # PhiAttention: LayerNorm(hidden // heads), not head_dim
            p.norm(f"{a}.q_layernorm", h // d.num_attention_heads, bias=True)
            p.norm(f"{a}.k_layernorm", h // d.num_attention_heads, bias=True)
        p.linear(f"{m}.fc1", h, i, bias=True)
        p.linear(f"{m}.fc2", i, h, bias=True)
        p.norm(f"model.layers.{n}.input_layernorm", h, bias=True)
    p.norm("model.final_layernorm", h, bias=True)
    _head(p, d, task, num_labels, lm_bias=True)
    return p, d
