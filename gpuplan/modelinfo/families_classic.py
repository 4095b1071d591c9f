"""Parameter tensors of gpt2, gpt_neox, opt, bert and roberta, without torch.

Layouts read from transformers 5.24 modeling_gpt2.py, modeling_gpt_neox.py,
modeling_opt.py, modeling_bert.py and modeling_roberta.py. Names and order match
model.named_parameters(), which yields a module's own parameters before its
children's (so BERT's cls.predictions.bias precedes cls.predictions.transform).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.modelinfo.defaults import GPT2_ALIASES, FamilyConfig, check_divides
from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.params import Dims, ParamList

GPT_TASKS = ("causal-lm", "seq-cls")
ENCODER_TASKS = ("causal-lm", "seq-cls", "masked-lm")


def classic_dims(
    cfg: FamilyConfig,
    inner: int,
    *,
    hidden: str = "hidden_size",
    heads: str = "num_attention_heads",
    layers: str = "num_hidden_layers",
    positions: str = "max_position_embeddings",
    hidden_dropout: str,
    attention_dropout: str,
) -> Dims:
    """Dims of a multi-head (no GQA), plain-MLP, LayerNorm family; the key names differ by family."""
    h, n = cfg.int(hidden), cfg.int(heads)
    check_divides(cfg, hidden, heads)
    return Dims(
        hidden_size=h,
        num_layers=cfg.int(layers, minimum=0),
        num_attention_heads=n,
        num_key_value_heads=n,
        head_dim=h // n,
        intermediate_size=inner,
        vocab_size=cfg.int("vocab_size"),
        max_position_embeddings=cfg.int(positions),
        mlp="plain",
        norm="layernorm",
        tie_word_embeddings=cfg.bool("tie_word_embeddings"),
        hidden_dropout=cfg.float(hidden_dropout),
        attention_dropout=cfg.float(attention_dropout),
    )


def count_gpt2(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """GPT2LMHeadModel / GPT2ForSequenceClassification: Conv1D layers with bias,
    learned positions (wpe), lm_head tied to wte by default."""
    cfg = FamilyConfig(model_type, config, aliases=GPT2_ALIASES)
    h, _ = cfg.int("n_embd"), cfg.int("n_head")  # n_head is checked here, read by classic_dims
    inner = cfg.int_or_none("n_inner") or 4 * h  # GPT2Block: n_inner None -> 4 * hidden
    d = classic_dims(
        cfg,
        inner,
        hidden="n_embd",
        heads="n_head",
        layers="n_layer",
        positions="n_positions",
        hidden_dropout="resid_pdrop",
        attention_dropout="attn_pdrop",
    )  # GPT2Attention checks heads too
    p = ParamList()
    p.embedding("transformer.wte", d.vocab_size, h)
    p.embedding("transformer.wpe", d.max_position_embeddings, h)
    for n in range(d.num_layers):
        b = f"transformer.h.{n}"
        p.norm(f"{b}.ln_1", h, bias=True)
        p.conv1d(f"{b}.attn.c_attn", 3 * h, h)
        p.conv1d(f"{b}.attn.c_proj", h, h)
        p.norm(f"{b}.ln_2", h, bias=True)
        if cfg.bool("add_cross_attention"):
            # GPT2Attention(is_cross_attention=True): c_attn makes k,v; q_attn makes q
            p.conv1d(f"{b}.crossattention.c_attn", 2 * h, h)
            p.conv1d(f"{b}.crossattention.q_attn", h, h)
            p.conv1d(f"{b}.crossattention.c_proj", h, h)
            p.norm(f"{b}.ln_cross_attn", h, bias=True)
        p.conv1d(f"{b}.mlp.c_fc", inner, h)
        p.conv1d(f"{b}.mlp.c_proj", h, inner)
    p.norm("transformer.ln_f", h, bias=True)
    if task == "seq-cls":
        p.linear("score", h, num_labels, bias=False)
    elif not d.tie_word_embeddings:
        p.add("lm_head.weight", d.vocab_size, h)
    return p, d


def count_gpt_neox(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """GPTNeoXForCausalLM / ...ForSequenceClassification (Pythia): fused
    query_key_value, two LayerNorms per (parallel) block, untied lm_head."""
    cfg = FamilyConfig(model_type, config)
    h, _, i = cfg.int("hidden_size"), cfg.int("num_attention_heads"), cfg.int("intermediate_size")
    d = classic_dims(cfg, i, hidden_dropout="hidden_dropout", attention_dropout="attention_dropout")
    attn_bias = cfg.bool("attention_bias")
    p = ParamList()
    p.embedding("gpt_neox.embed_in", d.vocab_size, h)
    for n in range(d.num_layers):
        b = f"gpt_neox.layers.{n}"
        p.norm(f"{b}.input_layernorm", h, bias=True)
        p.norm(f"{b}.post_attention_layernorm", h, bias=True)
        p.linear(f"{b}.attention.query_key_value", h, 3 * h, attn_bias)
        p.linear(f"{b}.attention.dense", h, h, attn_bias)
        p.linear(f"{b}.mlp.dense_h_to_4h", h, i, bias=True)
        p.linear(f"{b}.mlp.dense_4h_to_h", i, h, bias=True)
    p.norm("gpt_neox.final_layer_norm", h, bias=True)
    if task == "seq-cls":
        p.linear("score", h, num_labels, bias=False)
    elif not d.tie_word_embeddings:
        p.add("lm_head.weight", d.vocab_size, h)
    return p, d


def count_opt(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """OPTForCausalLM / OPTForSequenceClassification (modeling_opt.py)."""
    cfg = FamilyConfig(model_type, config)
    h, _, i = cfg.int("hidden_size"), cfg.int("num_attention_heads"), cfg.int("ffn_dim")
    proj = cfg.int_or_none("word_embed_proj_dim") or h  # OPTConfig.__post_init__
    d = classic_dims(cfg, i, hidden_dropout="dropout", attention_dropout="attention_dropout")
    bias, affine = cfg.bool("enable_bias"), cfg.bool("layer_norm_elementwise_affine")
    p = ParamList()
    b = "model.decoder"
    p.embedding(f"{b}.embed_tokens", d.vocab_size, proj)
    # OPTLearnedPositionalEmbedding adds an offset of 2 rows
    p.embedding(f"{b}.embed_positions", d.max_position_embeddings + 2, h)
    if proj != h:
        p.linear(f"{b}.project_out", h, proj, bias=False)
        p.linear(f"{b}.project_in", proj, h, bias=False)
    # OPTDecoder registers final_layer_norm before its layers (None for OPT-350m style)
    if cfg.bool("do_layer_norm_before") and not cfg.bool("_remove_final_layer_norm") and affine:
        p.norm(f"{b}.final_layer_norm", h, bias=True)
    for n in range(d.num_layers):
        layer = f"{b}.layers.{n}"
        for proj_name in ("k_proj", "v_proj", "q_proj", "out_proj"):
            p.linear(f"{layer}.self_attn.{proj_name}", h, h, bias)
        if affine:  # nn.LayerNorm(elementwise_affine=False) has no parameters
            p.norm(f"{layer}.self_attn_layer_norm", h, bias=True)
        p.linear(f"{layer}.fc1", h, i, bias)
        p.linear(f"{layer}.fc2", i, h, bias)
        if affine:
            p.norm(f"{layer}.final_layer_norm", h, bias=True)
    if task == "seq-cls":
        p.linear("score", proj, num_labels, bias=False)
    elif not d.tie_word_embeddings:
        p.add("lm_head.weight", d.vocab_size, proj)
    return p, d


def _encoder_attention(p: ParamList, name: str, h: int) -> None:
    for proj in ("query", "key", "value"):
        p.linear(f"{name}.self.{proj}", h, h, bias=True)
    p.linear(f"{name}.output.dense", h, h, bias=True)
    p.norm(f"{name}.output.LayerNorm", h, bias=True)


def count_bert_like(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims]:
    """bert and roberta: BertModel / RobertaModel plus the task head.

    Pooler only in BertForSequenceClassification (the MLM/causal heads and all
    RoBERTa heads build the encoder with add_pooling_layer=False). The MLM
    decoder weight ties to word_embeddings and decoder.bias to the head's own
    bias when tie_word_embeddings (else both are separate tensors)."""
    cfg = FamilyConfig(model_type, config)
    h, _, i = cfg.int("hidden_size"), cfg.int("num_attention_heads"), cfg.int("intermediate_size")
    d = classic_dims(cfg, i, hidden_dropout="hidden_dropout_prob", attention_dropout="attention_probs_dropout_prob")
    cross = cfg.bool("add_cross_attention")
    if cross and not cfg.bool("is_decoder"):
        # BertLayer.__init__ raises the same ValueError
        raise ModelConfigError(None, f"{model_type} config sets add_cross_attention = true without is_decoder = true; set both or neither")
    base = model_type  # base_model_prefix: "bert" / "roberta"
    p = ParamList()
    p.embedding(f"{base}.embeddings.word_embeddings", d.vocab_size, h)
    if model_type == "bert":
        p.embedding(f"{base}.embeddings.position_embeddings", d.max_position_embeddings, h)
    p.embedding(f"{base}.embeddings.token_type_embeddings", cfg.int("type_vocab_size"), h)
    p.norm(f"{base}.embeddings.LayerNorm", h, bias=True)
    if model_type == "roberta":  # RobertaEmbeddings registers positions last
        p.embedding(f"{base}.embeddings.position_embeddings", d.max_position_embeddings, h)
    for n in range(d.num_layers):
        layer = f"{base}.encoder.layer.{n}"
        _encoder_attention(p, f"{layer}.attention", h)
        if cross:
            _encoder_attention(p, f"{layer}.crossattention", h)
        p.linear(f"{layer}.intermediate.dense", h, i, bias=True)
        p.linear(f"{layer}.output.dense", i, h, bias=True)
        p.norm(f"{layer}.output.LayerNorm", h, bias=True)
    if task == "seq-cls" and model_type == "bert":
        p.linear(f"{base}.pooler.dense", h, h, bias=True)
        p.linear("classifier", h, num_labels, bias=True)
    elif task == "seq-cls":
        p.linear("classifier.dense", h, h, bias=True)  # RobertaClassificationHead
        p.linear("classifier.out_proj", h, num_labels, bias=True)
    elif model_type == "bert":  # BertOnlyMLMHead (BertForMaskedLM, BertLMHeadModel)
        p.add("cls.predictions.bias", d.vocab_size)
        p.linear("cls.predictions.transform.dense", h, h, bias=True)
        p.norm("cls.predictions.transform.LayerNorm", h, bias=True)
        if not d.tie_word_embeddings:
            p.linear("cls.predictions.decoder", h, d.vocab_size, bias=True)
    else:  # RobertaLMHead (RobertaForMaskedLM, RobertaForCausalLM)
        p.add("lm_head.bias", d.vocab_size)
        p.linear("lm_head.dense", h, h, bias=True)
        p.norm("lm_head.layer_norm", h, bias=True)
        if not d.tie_word_embeddings:
            p.linear("lm_head.decoder", h, d.vocab_size, bias=True)
    return p, d
