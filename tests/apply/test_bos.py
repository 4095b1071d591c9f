"""Instruction rows and packed text start each example with the BOS the tokenizer's post-processor adds.

tokenizer(text) on a Llama / Mistral / Gemma tokenizer puts bos_token first; apply tokenizes
these formats with add_special_tokens=False and adds it itself (gpuplan/apply/data/specials.py).
The Llama tokenizer is real, built in the test (tests/helpers/llama_tokenizer.py).
"""

from __future__ import annotations

import json

from gpuplan.apply.data.chat import IGNORE_INDEX
from gpuplan.apply.data.prepare import prepare_data
from gpuplan.apply.data.specials import affixes
from gpuplan.apply.data.tokenizer import byte_level_tokenizer
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.llama_tokenizer import llama_tokenizer

DOCS = ["Hello there.", "Sum 2 3 is 5.", "A short line."]


def test_affixes_read_the_post_processor():
    tok = llama_tokenizer()
    assert affixes(tok) == ([tok.bos_token_id], [])
    assert affixes(byte_level_tokenizer()) == ([], [])  # its post-processor adds nothing


def test_instruction_rows_start_with_bos_like_tokenizer_text(tmp_path):
    tok = llama_tokenizer()
    path = tmp_path / "inst.jsonl"
    path.write_text(json.dumps({"prompt": "Add 2 and 3.", "response": "5"}) + "\n")
    plan = cpu_plan(tmp_path, **{"data.train_files": [str(path)], "data.format": "instruction", "data.packing": False, "data.seq_len": 128})
    row = prepare_data(plan, tok).train[0]
    n = sum(row["attention_mask"])
    text = plan.value("data.prompt_template").replace("{prompt}", "Add 2 and 3.") + "5" + tok.eos_token
    assert row["input_ids"][:n] == tok(text)["input_ids"]  # what the model sees at inference: <s> first
    assert row["input_ids"][0] == tok.bos_token_id and row["labels"][0] == IGNORE_INDEX


def test_packed_instruction_examples_each_start_with_bos(tmp_path):
    tok = llama_tokenizer()
    path = tmp_path / "inst.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Add {i}.", "response": str(i)}) + "\n" for i in range(3)))
    plan = cpu_plan(tmp_path, **{"data.train_files": [str(path)], "data.format": "instruction", "data.packing": True, "data.seq_len": 256})
    row = prepare_data(plan, tok).train[0]
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0][:3]
    assert [row["input_ids"][s] for s in starts] == [tok.bos_token_id] * 3


def test_packed_text_documents_each_start_with_bos(tmp_path):
    tok = llama_tokenizer()
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 4))
    plan = cpu_plan(tmp_path, **{"data.train_files": [str(path)], "data.packing": True, "data.seq_len": 16})
    data = prepare_data(plan, tok)
    flat = [t for r in data.train for t in r["input_ids"]]
    one = tok(DOCS[0])["input_ids"] + [tok.eos_token_id]  # <s> document </s>
    assert flat[: len(one)] == one
    after_eos = [flat[i + 1] for i, t in enumerate(flat[:-1]) if t == tok.eos_token_id]
    assert after_eos and set(after_eos) == {tok.bos_token_id}  # every next document opens with <s>
