"""The analytic counts equal what transformers builds, to the parameter.

Every config in specs/models/ and every task its family supports is built on
the meta device (no memory) and compared tensor by tensor with model_facts().
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest

from gpuplan.modelinfo import TASKS, model_facts, read_config
from gpuplan.modelinfo.registry import FAMILIES
from gpuplan.modelinfo.vision_families import VLM_FAMILIES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = Path(__file__).resolve().parents[2] / "specs" / "models"
# vision-language models are checked by tests/modelinfo/test_vision_counts.py
SPEC_FILES = sorted(p for p in MODELS.glob("*.json") if json.loads(p.read_text())["model_type"] not in VLM_FAMILIES)
CASES = [(p.stem, task) for p in SPEC_FILES for task in FAMILIES[json.loads(p.read_text())["model_type"]][1]]


def meta_params(config: dict, task: str, num_labels: int = 2) -> list[tuple[str, tuple[int, ...]]]:
    """named_parameters() of the transformers model for `task`, built on the meta device."""
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    if task == "seq-cls":
        hf_config.num_labels = num_labels
    auto = getattr(transformers, TASKS[task])
    with torch.device("meta"):
        model = auto.from_config(hf_config)
    named = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    # tied tensors appear once in both lists
    assert sum(p.numel() for p in model.parameters()) == sum(_numel(s) for _, s in named)
    return named


@functools.cache
def _spec_meta(stem: str, task: str) -> tuple:
    return tuple(meta_params(read_config(MODELS / f"{stem}.json"), task))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_specs_cover_every_family():
    families = {json.loads(p.read_text())["model_type"] for p in SPEC_FILES}
    assert families == set(FAMILIES)


@pytest.mark.parametrize(("stem", "task"), CASES)
def test_spec_count_equals_meta_device(stem, task):
    facts = model_facts(read_config(MODELS / f"{stem}.json"), task)
    expected = _spec_meta(stem, task)
    assert facts.n_params == sum(_numel(s) for _, s in expected)
    assert sum(_numel(s) for _, s in facts.param_shapes) == facts.n_params
    assert facts.param_shapes == expected  # same names, shapes and order
    assert facts.source == "analytic" and facts.task == task


# Published totals (model cards, HF safetensors metadata) for the base model.
PUBLISHED = {
    ("llama-3.1-8b", "causal-lm"): 8_030_261_248,
    ("llama-2-7b", "causal-lm"): 6_738_415_616,  # the Llama 2 paper's 7B and 13B, as the hub repos count them
    ("llama-2-13b", "causal-lm"): 13_015_864_320,
    ("llama-3.1-70b", "causal-lm"): 70_553_706_496,
    ("llama-2-70b", "causal-lm"): 68_976_648_192,
    ("llama-3.2-1b", "causal-lm"): 1_235_814_400,
    ("mistral-7b-v0.3", "causal-lm"): 7_248_023_552,
    ("qwen2.5-0.5b", "causal-lm"): 494_032_768,
    ("qwen2.5-7b", "causal-lm"): 7_615_616_512,
    ("gemma-2b", "causal-lm"): 2_506_172_416,
    ("gemma-7b", "causal-lm"): 8_537_680_896,
    ("phi-2", "causal-lm"): 2_779_683_840,
    ("phi-3-mini-4k", "causal-lm"): 3_821_079_552,
    ("gpt2", "causal-lm"): 124_439_808,
    ("pythia-160m", "causal-lm"): 162_322_944,
    ("pythia-1.4b", "causal-lm"): 1_414_647_808,
    ("opt-125m", "causal-lm"): 125_239_296,
    ("opt-350m", "causal-lm"): 331_196_416,
    ("mixtral-8x7b-v0.1", "causal-lm"): 46_702_792_704,
    # BertModel with pooler (109,482,240) + classifier Linear(768, 2)
    ("bert-base-uncased", "seq-cls"): 109_482_240 + 768 * 2 + 2,
}


@pytest.mark.parametrize(("stem", "task"), sorted(PUBLISHED))
def test_published_counts(stem, task):
    assert model_facts(read_config(MODELS / f"{stem}.json"), task).n_params == PUBLISHED[stem, task]


# Variants that switch on every optional tensor the counters know about.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 101,
    "max_position_embeddings": 64,
}
VARIANTS = [
    {"model_type": "llama", **SMALL, "attention_bias": True, "mlp_bias": True, "num_key_value_heads": 2},
    {"model_type": "llama", **SMALL, "head_dim": 32, "tie_word_embeddings": True},
    {"model_type": "mistral", **SMALL, "num_key_value_heads": 1, "head_dim": 8},
    {"model_type": "qwen2", **SMALL, "num_key_value_heads": 2, "tie_word_embeddings": True},
    {"model_type": "qwen2", **SMALL, "num_key_value_heads": 4, "head_dim": 32},
    {"model_type": "qwen3", **SMALL, "num_key_value_heads": 2, "attention_bias": True},
    {"model_type": "gemma", **SMALL, "num_key_value_heads": 1, "tie_word_embeddings": False},
    {"model_type": "gemma2", **SMALL, "num_key_value_heads": 2, "attention_bias": True},
    {"model_type": "mixtral", **SMALL, "num_key_value_heads": 2, "num_local_experts": 3},
    {"model_type": "phi3", **SMALL, "num_key_value_heads": 2, "pad_token_id": 0},
    {"model_type": "phi", **SMALL, "qk_layernorm": True, "tie_word_embeddings": True},
    {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "n_positions": 32,
        "vocab_size": 101,
        "n_inner": 80,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "gpt2",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": 101,
        "add_cross_attention": True,
    },
    {"model_type": "gpt_neox", **SMALL, "attention_bias": False, "tie_word_embeddings": True},
    {
        "model_type": "opt",
        "hidden_size": 64,
        "ffn_dim": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 101,
        "word_embed_proj_dim": 32,
        "enable_bias": False,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "opt",
        "hidden_size": 64,
        "ffn_dim": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 101,
        "layer_norm_elementwise_affine": False,
    },
    {"model_type": "bert", **SMALL, "type_vocab_size": 3, "tie_word_embeddings": False},
    {"model_type": "bert", **SMALL, "is_decoder": True, "add_cross_attention": True},
    {"model_type": "roberta", **SMALL, "pad_token_id": 1, "tie_word_embeddings": False},
    {"model_type": "roberta", **SMALL, "pad_token_id": 1, "is_decoder": True, "add_cross_attention": True},
]


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: c["model_type"])
def test_variant_equals_meta_device(config):
    for task in FAMILIES[config["model_type"]][1]:
        facts = model_facts(config, task, num_labels=3)
        assert facts.param_shapes == tuple(meta_params(config, task, num_labels=3)), task


def test_registry_tasks_match_transformers_auto_mappings():
    from transformers.models.auto import modeling_auto as auto

    mappings = {
        "causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "seq-cls": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "masked-lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    }
    for model_type, (_, tasks) in FAMILIES.items():
        assert tasks == tuple(t for t, m in mappings.items() if model_type in m), model_type
