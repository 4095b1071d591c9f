"""read_config errors, argument checks, and the no-torch import boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuplan.modelinfo import ModelConfigError, known_model_types, model_facts, read_config

MODELS = Path(__file__).resolve().parents[2] / "specs" / "models"


def test_read_config_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')
    assert read_config(tmp_path) == read_config(tmp_path / "config.json")
    assert read_config(str(tmp_path))["hidden_size"] == 64


def test_read_config_missing_file(tmp_path):
    with pytest.raises(ModelConfigError, match=r"nope\.json: file not found"):
        read_config(tmp_path / "nope.json")
    with pytest.raises(ModelConfigError, match=r"config\.json: file not found"):
        read_config(tmp_path)  # a directory without config.json


def test_read_config_invalid_json_has_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "model_type": "llama",\n  "hidden_size": 64,\n}\n')
    with pytest.raises(ModelConfigError, match=r"bad\.json:4:1: invalid JSON") as info:
        read_config(path)
    assert isinstance(info.value, ValueError)


def test_read_config_missing_and_invalid_model_type(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"hidden_size": 64}')
    with pytest.raises(ModelConfigError, match=r"missing required field 'model_type'"):
        read_config(path)
    path.write_text('{"model_type": 3}')
    with pytest.raises(ModelConfigError, match=r"'model_type' must be a non-empty string, got 3"):
        read_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match=r"expected a JSON object at the top level, got list"):
        read_config(path)


def test_bad_arguments_and_values():
    with pytest.raises(ModelConfigError, match=r"unknown task 'clm'; choose one of causal-lm"):
        model_facts({"model_type": "llama"}, "clm")
    with pytest.raises(ModelConfigError, match=r"num_labels = 0 is invalid"):
        model_facts({"model_type": "llama"}, "seq-cls", num_labels=0)
    with pytest.raises(ModelConfigError, match=r"missing the required field 'model_type'"):
        model_facts({"hidden_size": 64})
    with pytest.raises(ModelConfigError, match=r"llama config key 'hidden_size' = '4096' is invalid"):
        model_facts({"model_type": "llama", "hidden_size": "4096"})
    with pytest.raises(
        ModelConfigError,
        match=r"num_key_value_heads = 8 \(the mistral default; "
        r"the key is absent\); choose them so that num_key_value_heads divides",
    ):
        model_facts({"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 4})


def test_absent_keys_take_family_defaults():
    # LlamaConfig() is Llama-2-7B: 6,738,415,616 parameters
    facts = model_facts({"model_type": "llama"})
    assert facts.n_params == 6_738_415_616
    assert "tie_word_embeddings absent: the llama default (false) applies" in facts.notes
    gemma = model_facts(read_config(MODELS / "gemma-2b.json"))
    assert gemma.tie_word_embeddings and gemma.head_dim == 256 and gemma.num_key_value_heads == 1


def test_a_required_key_without_a_value_or_default_is_named():
    # FamilyConfig.int is for keys every config of the family has; before it returned None
    # for one with no value and no default, and the counter failed later in arithmetic
    from gpuplan.modelinfo.defaults import FamilyConfig

    cfg = FamilyConfig("llama", {"model_type": "llama"})
    with pytest.raises(ModelConfigError, match=r"llama config key 'num_local_experts' = None is invalid: .*the key is required"):
        cfg.int("num_local_experts")
    assert cfg.int_or_none("num_local_experts") is None
    assert cfg.int_or_none("head_dim") is None  # derived: hidden // heads
    assert cfg.int("hidden_size") == 4096


def test_facts_fields_for_a_known_model():
    f = model_facts(read_config(MODELS / "llama-3.1-8b.json"))
    assert (
        f.hidden_size,
        f.num_layers,
        f.num_attention_heads,
        f.num_key_value_heads,
        f.head_dim,
        f.intermediate_size,
        f.vocab_size,
        f.max_position_embeddings,
    ) == (4096, 32, 32, 8, 128, 14336, 128256, 131072)
    assert (f.mlp, f.norm, f.tie_word_embeddings, f.source) == ("gated", "rmsnorm", False, "analytic")
    phi = model_facts(read_config(MODELS / "phi-2.json"))
    assert (phi.mlp, phi.norm, phi.hidden_dropout) == ("plain", "layernorm", 0.1)
    bert = model_facts(read_config(MODELS / "bert-base-uncased.json"), "masked-lm")
    assert (bert.hidden_dropout, bert.attention_dropout, bert.tie_word_embeddings) == (0.1, 0.1, True)


def test_tiny_llama_cpu_spec():
    f = model_facts(read_config(MODELS / "tiny-llama-cpu.json"))
    assert (
        f.hidden_size,
        f.num_layers,
        f.num_attention_heads,
        f.num_key_value_heads,
        f.intermediate_size,
        f.vocab_size,
        f.max_position_embeddings,
    ) == (128, 4, 4, 2, 344, 260, 512)
    assert f.tie_word_embeddings and f.n_params == 759_424


def test_known_model_types():
    assert {"llama", "mistral", "qwen2", "gemma", "phi", "gpt2", "gpt_neox", "bert"} <= set(known_model_types())


def test_analytic_path_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from gpuplan.modelinfo import model_facts, read_config\n"
        "from gpuplan.modelinfo.registry import FAMILIES\n"
        f"for name in {sorted(p.name for p in MODELS.glob('*.json'))!r}:\n"
        f"    config = read_config({str(MODELS)!r} + '/' + name)\n"
        "    for task in FAMILIES.get(config['model_type'], (None, ('causal-lm',)))[1]:  # a VLM: causal-lm\n"
        "        model_facts(config, task)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_spec_model_file_is_a_transformers_config():
    for path in MODELS.glob("*.json"):
        data = json.loads(path.read_text())
        assert data["model_type"] in known_model_types(), path.name
        assert path.name == path.name.lower() and "_" not in path.name, path.name
