"""Chat rows are tokenized once: the trained ids are apply_chat_template's, for SentencePiece-style tokenizers too.

The Llama tokenizer is built in the test (tests/helpers/llama_tokenizer.py); nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest

from gpuplan.apply.data.chat import chat_template_of, formatter, tokenize_segments
from gpuplan.apply.data.tokenizer import byte_level_tokenizer
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.llama_tokenizer import llama_tokenizer

CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Sum 2 3"},
    {"role": "assistant", "content": "5"},
]


def _ids(encoded):
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.mark.parametrize("template", [None, "chatml"])
def test_trained_ids_equal_apply_chat_template_for_a_metaspace_tokenizer(tmp_path, template):
    tok = llama_tokenizer()
    if template == "chatml":
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    plan = cpu_plan(tmp_path, **{"data.format": "chat", "data.chat_template": template})
    fmt = formatter(plan, tok)
    ids, trained = tokenize_segments(fmt.segments({"messages": CONVERSATION}, 0), tok)
    expected = _ids(tok.apply_chat_template(CONVERSATION, chat_template=chat_template_of(plan, tok), tokenize=True))
    assert ids == expected
    answers = tok.decode([i for i, on in zip(ids, trained) if on])
    assert "Hello!" in answers and "5" in answers and "Hi there" not in answers and "Sum" not in answers
    assert tok.eos_token in answers if template is None else "<|im_end|>" in answers


def test_prompt_and_answer_tokens_split_at_the_turn(tmp_path):
    tok = byte_level_tokenizer()  # one token per byte: the trained bytes are exactly the assistant turns
    plan = cpu_plan(tmp_path, **{"data.format": "chat", "data.chat_template": "chatml"})
    segs = formatter(plan, tok).segments({"messages": CONVERSATION}, 0)
    ids, trained = tokenize_segments(segs, tok)
    assert tok.decode([i for i, on in zip(ids, trained) if on]) == "Hello!<|im_end|>\n5<|im_end|>\n"
    assert len(ids) == len("".join(t for t, _ in segs).encode())


def test_chat_rows_through_prepare_data_match_the_template(tmp_path):
    from gpuplan.apply.data.prepare import prepare_data

    tok = llama_tokenizer()
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    plan = cpu_plan(
        tmp_path,
        **{"data.train_files": [str(path)], "data.format": "chat", "data.chat_template": None, "data.seq_len": 128, "data.packing": False},
    )
    data = prepare_data(plan, tok)
    row = data.train[0]
    n = sum(row["attention_mask"])
    assert row["input_ids"][:n] == _ids(tok.apply_chat_template(CONVERSATION, tokenize=True))


def test_tokenizers_without_offsets_mark_the_same_tokens(tmp_path):
    from gpuplan.apply.data.chat import _by_prefixes

    tok = llama_tokenizer()
    plan = cpu_plan(tmp_path, **{"data.format": "chat", "data.chat_template": None})
    segs = formatter(plan, tok).segments({"messages": CONVERSATION}, 0)
    assert _by_prefixes(segs, "".join(t for t, _ in segs), tok) == tokenize_segments(segs, tok)
