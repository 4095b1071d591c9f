"""Chat and instruction data: trained vs masked tokens, packing without cross-example attention, plan checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuplan.apply.data.chat import IGNORE_INDEX
from gpuplan.apply.data.prepare import prepare_data
from gpuplan.apply.data.tokenizer import byte_level_tokenizer
from gpuplan.apply.errors import ApplyError
from gpuplan.plan.build import plan_file
from gpuplan.plan.rules.chat_data import PACKED_POSITION_FAMILIES
from gpuplan.plan.types import PlanError
from tests.helpers.apply_plans import MICRO_LLAMA, REPO, cpu_plan, read_jsonl
from tests.helpers.planning import ENV, SPECS

CHAT = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Sum 2 3"},
            {"role": "assistant", "content": "5"},
        ]
    },
    {"messages": [{"role": "user", "content": "Colour of snow?"}, {"role": "assistant", "content": "White."}]},
]


def _chat_plan(tmp_path, rows=CHAT, **over):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    values = {
        "data.train_files": [str(path)],
        "data.format": "chat",
        "data.chat_template": "chatml",
        "data.seq_len": 256,
        "data.packing": False,
    }
    values.update(over)
    return cpu_plan(tmp_path, **values)


def _trained_text(tok, batch, row):
    ids, labels = batch["input_ids"][row].tolist(), batch["labels"][row].tolist()
    return tok.decode([i for i, lab in zip(ids, labels) if lab != IGNORE_INDEX])


def test_collator_labels_train_only_assistant_turns(tmp_path):
    tok = byte_level_tokenizer()
    data = prepare_data(_chat_plan(tmp_path), tok)
    batch = data.collator([data.train[i] for i in range(len(data.train))])
    assert _trained_text(tok, batch, 0) == "Hello!<|im_end|>\n5<|im_end|>\n"
    assert _trained_text(tok, batch, 1) == "White.<|im_end|>\n"
    everything = tok.decode([i for i, m in zip(batch["input_ids"][0].tolist(), batch["attention_mask"][0]) if m])
    assert everything.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there")
    assert data.stats.trained_tokens == len("Hello!<|im_end|>\n5<|im_end|>\nWhite.<|im_end|>\n")


def test_train_on_prompt_trains_every_token(tmp_path):
    tok = byte_level_tokenizer()
    data = prepare_data(_chat_plan(tmp_path, **{"data.train_on_prompt": True}), tok)
    assert data.stats.trained_tokens == data.stats.tokens


def test_instruction_rows_mask_the_prompt(tmp_path):
    path = tmp_path / "inst.jsonl"
    path.write_text(json.dumps({"q": "Add 1 and 2.", "a": "3"}) + "\n")
    plan = cpu_plan(
        tmp_path,
        **{
            "data.train_files": [str(path)],
            "data.format": "instruction",
            "data.prompt_field": "q",
            "data.response_field": "a",
            "data.packing": False,
        },
    )
    tok = byte_level_tokenizer()
    data = prepare_data(plan, tok)
    batch = data.collator([data.train[0]])
    assert _trained_text(tok, batch, 0) == "3<eos>"


def test_missing_messages_field_names_the_key(tmp_path):
    with pytest.raises(ApplyError, match="data.messages_field = 'turns'.*fields present: messages"):
        prepare_data(_chat_plan(tmp_path, **{"data.messages_field": "turns"}), byte_level_tokenizer())


def test_tokenizer_without_template_and_no_chat_template_is_an_error(tmp_path):
    with pytest.raises(ApplyError, match='data.chat_template = "chatml"'):
        prepare_data(_chat_plan(tmp_path, **{"data.chat_template": None}), byte_level_tokenizer())


def test_jinja_file_template(tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    tok = byte_level_tokenizer()
    data = prepare_data(_chat_plan(tmp_path, **{"data.chat_template": str(tpl)}), tok)
    batch = data.collator([data.train[1]])
    assert _trained_text(tok, batch, 0) == "White.\n"


def test_packed_examples_do_not_attend_to_each_other(tmp_path):
    """Packed logits equal each example's logits alone: the position resets block attention across examples."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = byte_level_tokenizer()
    data = prepare_data(_chat_plan(tmp_path, **{"data.packing": True, "data.seq_len": 512}), tok)
    assert len(data.train) == 1 and data.stats.sequences == 1
    block = data.collator([data.train[0]])
    assert "attention_mask" not in block
    pos = block["position_ids"][0].tolist()
    starts = [i for i, p in enumerate(pos) if p == 0]
    assert len(starts) == 3  # two examples and the padding tail
    cfg = dict(MICRO_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():
        # use_cache=False as apply sets it for packed data (run.no_cache_while_training): with a cache,
        # transformers skips the packed-sequence mask
        packed = model(input_ids=block["input_ids"], position_ids=block["position_ids"], use_cache=False).logits[0]
        second = block["input_ids"][:, starts[1] : starts[2]]
        alone = model(input_ids=second).logits[0]
    torch.testing.assert_close(packed[starts[1] : starts[2]], alone, atol=1e-5, rtol=1e-4)
    labels = block["labels"][0].tolist()
    assert labels[starts[1]] == IGNORE_INDEX  # no label predicted across the boundary


def test_packing_families_build_their_mask_from_position_ids():
    import transformers

    base = Path(transformers.__file__).parent / "models"
    for family in PACKED_POSITION_FAMILIES:
        folder = family.removesuffix("_text")
        src = (base / folder / f"modeling_{folder}.py").read_text()
        assert "create_causal_mask" in src and "position_ids" in src, family


def _chat_spec(tmp_path, old: str = "", new: str = "") -> Path:
    text = (SPECS / "tiny-chat.toml").read_text().replace('"models/', f'"{SPECS}/models/')
    path = tmp_path / "chat.toml"
    path.write_text(text.replace('"data/', f'"{SPECS}/data/').replace(old, new))
    return path


def test_plan_chat_from_scratch_without_template_names_the_key(tmp_path):
    with pytest.raises(PlanError, match="needs a chat template") as e:
        plan_file(_chat_spec(tmp_path, 'chat_template = "chatml"', ""), environment=ENV)
    d = e.value.diagnostics[0]
    assert (d.key, d.fix) == ("data.chat_template", 'set data.chat_template = "chatml"')


def test_plan_chat_needs_causal_lm(tmp_path):
    with pytest.raises(PlanError, match='data.format = "chat" trains a causal LM') as e:
        plan_file(_chat_spec(tmp_path, 'task = "causal-lm"', 'task = "seq-cls"'), environment=ENV)
    assert e.value.diagnostics[0].fix == 'set model.task = "causal-lm" or data.format = "text"'


def test_plan_says_how_chat_is_packed(tmp_path):
    plan = plan_file(_chat_spec(tmp_path), environment=ENV)
    assert plan.value("data.packing") is True
    assert "position ids reset per example" in plan.settings["data.packing"].reason


def test_plan_pads_chat_for_families_without_position_packing(tmp_path):
    cfg = json.loads((SPECS / "models" / "opt-125m.json").read_text())
    (tmp_path / "opt.json").write_text(json.dumps(cfg))
    plan = plan_file(_chat_spec(tmp_path, f'"{SPECS}/models/tiny-llama-cpu.json"', f'"{tmp_path}/opt.json"'), environment=ENV)
    assert plan.value("data.packing") is False
    assert "padded to 512 tokens instead" in plan.settings["data.packing"].reason


@pytest.mark.slow
def test_chat_fine_tune_loss_falls(tmp_path):
    from gpuplan.apply.train.execute import execute

    rows = read_jsonl(REPO / "specs" / "data" / "chat.jsonl")[:64]
    plan = _chat_plan(
        tmp_path,
        rows,
        **{
            "data.packing": True,
            "data.seq_len": 256,
            "training.max_steps": 30,
            "training.learning_rate": 1e-2,
            "training.logging_steps": 5,
            "training.effective_batch_size": 4,
            "training.per_device_train_batch_size": 4,
        },
    )
    results = execute(plan)
    saved = json.loads(Path(results["final_model_dir"], "config.json").read_text())
    assert saved["use_cache"] is True  # off only while training
    losses = [r["loss"] for r in read_jsonl(os.path.join(plan.value("output.dir"), "metrics.jsonl")) if "loss" in r]
    assert losses[-1] < 0.6 * losses[0], losses
