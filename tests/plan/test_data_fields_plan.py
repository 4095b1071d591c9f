"""The plan refuses data that apply cannot read with the spec's data keys (issue 30's randomized
plan -> apply found both): SFT rows without the field data.text_field / messages_field names
(gpuplan/spec/data_fields.py), and a preference objective on a plain-text file
(gpuplan/plan/rules/preference.py). Each refusal names the key and the fields, and its fix,
followed, plans."""

from __future__ import annotations

import pytest

from gpuplan.plan.types import PlanError
from tests.helpers.planning import plan_text, spec
from tests.helpers.preference_rows import conversational, kto_rows, pairs, write_jsonl


def _errors(tmp_path, text: str) -> list:
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text)
    return [d for d in e.value.diagnostics if d.severity == "error"]


def _spec(data_file: str, data: str = "", training: str = "") -> str:
    return spec(data=f'seq_len = 128\ntrain_files = ["{data_file}"]\n{data}', training=f"effective_batch_size = 4\n{training}")


def test_sft_on_preference_pairs_is_refused_naming_text_field_and_the_fields_and_dpo_plans(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs(32))
    (err,) = _errors(tmp_path, _spec(data))
    assert err.key == "data.text_field"
    assert "data.text_field = 'text'" in err.summary and "'prompt', 'chosen', 'rejected'" in err.summary
    assert 'training.objective = "dpo"' in err.fix
    plan = plan_text(tmp_path, _spec(data, training='objective = "dpo"'))  # the fix, followed
    assert plan.value("training.objective") == "dpo"


def test_sft_on_kto_rows_is_refused_and_its_kto_fix_plans(tmp_path):
    data = write_jsonl(tmp_path / "kto.jsonl", kto_rows(32))
    (err,) = _errors(tmp_path, _spec(data))
    assert err.key == "data.text_field" and 'training.objective = "kto"' in err.fix
    assert plan_text(tmp_path, _spec(data, training='objective = "kto"')).value("training.objective") == "kto"


def test_sft_chat_on_conversational_pairs_names_messages_field_and_its_fix_plans(tmp_path):
    data = write_jsonl(tmp_path / "conv.jsonl", conversational(pairs(32)))
    (err,) = _errors(tmp_path, _spec(data, data='format = "chat"\nchat_template = "chatml"'))
    assert err.key == "data.messages_field" and "data.messages_field = 'messages'" in err.summary
    assert 'training.objective = "dpo", data.format = "chat"' in err.fix
    plan = plan_text(tmp_path, _spec(data, data='format = "chat"\nchat_template = "chatml"', training='objective = "dpo"'))
    assert plan.value("data.format") == "chat"


def test_chat_rows_under_the_text_format_get_the_chat_keys_as_the_fix(tmp_path):
    rows = [{"messages": [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["chosen"]}]} for p in pairs(8)]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    (err,) = _errors(tmp_path, _spec(data))
    # the model has no tokenizer with a chat template (a config only), so the fix names one
    assert err.key == "data.text_field"
    assert err.fix.startswith('set data.format = "chat", data.messages_field = "messages", data.chat_template = "chatml"')
    plan_text(tmp_path, _spec(data, data='format = "chat"\nmessages_field = "messages"\nchat_template = "chatml"'))


def test_rows_with_the_named_field_plan_and_only_the_first_rows_are_read(tmp_path):
    rows = [{"body": "a b c"}] * 20 + [{"text": "late"}]  # the 21st row is past the rows the plan reads
    data = write_jsonl(tmp_path / "docs.jsonl", rows)
    plan_text(tmp_path, _spec(data, data='text_field = "body"'))
    (err,) = _errors(tmp_path, _spec(data))
    assert "none of the first 20 rows" in err.summary and 'data.text_field = "body"' in err.fix


@pytest.mark.parametrize("objective", ["dpo", "kto"])
def test_a_preference_objective_on_a_plain_text_file_is_refused_and_sft_plans(tmp_path, objective):
    data = tmp_path / "notes.txt"
    data.write_text("ping pong zig.\nzag tick tock.\n" * 20)
    (err,) = _errors(tmp_path, _spec(str(data), training=f'objective = "{objective}"'))
    assert err.key == "data.train_files[0]" and "plain-text file" in err.summary
    assert ".jsonl" in err.fix and 'training.objective = "sft"' in err.fix
    plan_text(tmp_path, _spec(str(data)))  # the fix, followed: sft on the text


def test_seq_cls_rows_without_the_label_field_name_the_fields_to_pick_from(tmp_path):
    data = write_jsonl(tmp_path / "cls.jsonl", [{"text": "good", "y": 1}, {"text": "bad", "y": 0}] * 4)  # a full default batch of 8 rows
    cls = 'seq_len = 128\ntrain_files = ["{}"]\n{}'
    (err,) = _errors(tmp_path, spec(model="bert-base-uncased", data=cls.format(data, 'label_field = "label"'), extra='task = "seq-cls"'))
    assert err.key == "data.label_field" and err.fix.startswith("set data.label_field to one of the fields the rows have (text, y)")
    plan_text(tmp_path, spec(model="bert-base-uncased", data=cls.format(data, 'label_field = "y"'), extra='task = "seq-cls"'))
