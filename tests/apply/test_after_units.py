"""The after-run pieces that need no trained model: templates, the serving memory, the base fingerprint,
and apply's refusal of sample settings it cannot honour."""

from __future__ import annotations

import json

import pytest

from gpuplan.after.evaluate import with_value
from gpuplan.after.export import instruction_chat_template
from gpuplan.apply.data.prompting import Prompting, end_of_turn
from gpuplan.apply.errors import ApplyError
from gpuplan.apply.model import base_files as fingerprint
from gpuplan.modelinfo import model_facts, read_config
from gpuplan.plan.estimate.memory.inference import inference_memory
from gpuplan.spec.chat_templates import CHAT_TEMPLATES
from tests.helpers.apply_plans import REPO, cpu_plan

TEMPLATE = "### Instruction:\n{prompt}\n\n### Response:\n"
TURNS = [{"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "5."}, {"role": "user", "content": "And 4 and 4?"}]


@pytest.fixture(scope="module")
def tok():
    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    return byte_level_tokenizer()


def test_instruction_prompts_follow_the_trained_template_with_earlier_turns(tok):
    p = Prompting("instruction", TEMPLATE, None, False)
    assert p.render(tok, TURNS) == (
        "### Instruction:\nAdd 2 and 3.\n\n### Response:\n5.<eos>### Instruction:\nAnd 4 and 4?\n\n### Response:\n"
    )


def test_the_exported_instruction_template_renders_what_training_saw(tok):
    tok.chat_template = instruction_chat_template(TEMPLATE)
    assert tok.apply_chat_template(TURNS, tokenize=False) == Prompting("instruction", TEMPLATE, None, False).render(tok, TURNS)


def test_chatml_ends_a_turn_at_im_end(tok):
    assert end_of_turn(tok, CHAT_TEMPLATES["chatml"]) == "<|im_end|>"
    p = Prompting("chat", CHAT_TEMPLATES["chatml"], "<|im_end|>", False)
    assert p.answer("Lima.<|im_end|>\n<|im_start|>user") == "Lima."


def test_kv_cache_of_llama_3_8b_is_128_kib_per_token():
    facts = model_facts(read_config(REPO / "specs" / "models" / "llama-3.1-8b.json"))
    m = inference_memory(facts, dtype="bfloat16", context=8192)
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes = 131,072 bytes per token (GQA)
    assert m.kv_bytes_per_token == 131_072 and m.kv_cache_bytes == 8192 * 131_072
    assert m.weights_bytes == facts.n_params * 2 == 16_060_522_496
    assert m.total_bytes == m.weights_bytes + m.kv_cache_bytes + m.activation_bytes + m.overhead_bytes
    assert inference_memory(facts, dtype="bfloat16", context=8192, device="cpu").overhead_bytes == 0


def test_the_fingerprint_sees_a_changed_a_missing_and_a_new_file(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x" * 5000)
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(fingerprint, "FULL_HASH_BYTES", 1000)  # the weights are hashed by samples
    monkeypatch.setattr(fingerprint, "SAMPLE_BYTES", 100)
    recorded = json.loads(json.dumps(fingerprint.base_fingerprint(str(tmp_path))))  # as the state stores it
    assert recorded["model.safetensors"]["sha256"].startswith("sampled:")
    assert fingerprint.changed_files(recorded, str(tmp_path)) == []
    (tmp_path / "model.safetensors").write_bytes(b"x" * 4999 + b"y")  # the last sampled byte
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "adapter_config.json").write_text("{}")
    assert fingerprint.changed_files(recorded, str(tmp_path)) == [
        "tokenizer.json is gone",
        "model.safetensors changed",
        "adapter_config.json is new",
    ]


@pytest.mark.parametrize(
    "values,expect",
    [
        ({"model.task": "seq-cls"}, 'eval.sample_prompts generates text, which needs model.task = "causal-lm"'),
        ({"hardware.count": 2, "distributed.strategy": "fsdp"}, "the weights are sharded and rank 0 cannot generate alone"),
        ({"eval.sample_at_eval": True}, "eval.sample_at_eval = true but the run never evaluates"),
    ],
)
def test_apply_refuses_samples_it_cannot_generate_before_training(tmp_path, values, expect):
    from gpuplan.apply.train.execute import execute

    plan = with_value(cpu_plan(tmp_path), "eval.sample_prompts", ["hello"])
    for k, v in values.items():
        plan = with_value(plan, k, v)
    with pytest.raises(ApplyError, match=expect):
        execute(plan, echo=lambda s: None, progress=False)
    assert not (tmp_path / "run").exists()  # refused before output.dir is created
