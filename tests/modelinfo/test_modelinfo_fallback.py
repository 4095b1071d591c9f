"""Architectures without an analytic counter: meta-device fallback and its errors."""

from __future__ import annotations

import os

import pytest

from gpuplan.modelinfo import ModelConfigError, known_model_types, model_facts

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# BLOOM has no analytic counter; its config uses n_layer / n_head (BloomConfig.attribute_map)
TINY_BLOOM = {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "hidden_dropout": 0.1}


def _meta_total(config, auto_cls, **overrides):
    kwargs = {k: v for k, v in config.items() if k != "model_type"} | overrides
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    with torch.device("meta"):
        model = auto_cls.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def test_bloom_is_not_analytic():
    assert "bloom" not in known_model_types()


def test_unknown_family_counted_on_meta_device_with_note():
    facts = model_facts(TINY_BLOOM)
    assert facts.source == "meta-device"
    assert facts.notes[0] == ("unknown architecture bloom: counted by instantiating on the meta device (imports torch)")
    assert "intermediate_size not in the config: assumed 4 x hidden_size" in facts.notes
    assert facts.n_params == _meta_total(TINY_BLOOM, transformers.AutoModelForCausalLM)
    assert sum(_n(s) for _, s in facts.param_shapes) == facts.n_params
    assert (facts.hidden_size, facts.num_layers, facts.num_attention_heads) == (64, 2, 4)
    assert (facts.intermediate_size, facts.vocab_size) == (256, 100)
    assert facts.max_position_embeddings is None  # ALiBi: no position limit in the config
    assert facts.tie_word_embeddings is True  # BLOOM ties lm_head to word_embeddings
    assert (facts.norm, facts.mlp, facts.hidden_dropout) == ("layernorm", "plain", 0.1)


def test_unknown_family_seq_cls_uses_num_labels():
    facts = model_facts(TINY_BLOOM, "seq-cls", num_labels=5)
    assert facts.param_shapes[-1] == ("score.weight", (5, 64))
    assert facts.n_params == _meta_total(TINY_BLOOM, transformers.AutoModelForSequenceClassification, num_labels=5)


def test_unknown_family_unsupported_task():
    with pytest.raises(
        ModelConfigError,
        match=r"task 'masked-lm' is not supported for model_type "
        r"'bloom'.*supported tasks: causal-lm, seq-cls",
    ):
        model_facts(TINY_BLOOM, "masked-lm")


def test_fallback_can_be_refused():
    with pytest.raises(ModelConfigError, match=r"'bloom' has no analytic parameter count"):
        model_facts(TINY_BLOOM, allow_meta_fallback=False)


def test_garbage_model_type_suggests_closest():
    with pytest.raises(ModelConfigError, match=r"unknown model_type 'lamma'.*Did you mean 'llama'"):
        model_facts({"model_type": "lamma", "hidden_size": 64})
    with pytest.raises(
        ModelConfigError,
        match=r"unknown model_type 'zzqx'.*Counted without torch: "
        r"bert, gemma",
    ):
        model_facts({"model_type": "zzqx"})


def test_analytic_family_unsupported_task():
    with pytest.raises(
        ModelConfigError,
        match=r"task 'masked-lm' is not supported for model_type "
        r"'llama': transformers has no AutoModelForMaskedLM",
    ):
        model_facts({"model_type": "llama"}, "masked-lm")


def _n(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_unknown_family_invalid_value_is_a_config_error():
    with pytest.raises(ModelConfigError, match=r"transformers rejects this bloom config: .*n_layer"):
        model_facts({**TINY_BLOOM, "n_layer": "two"})
