"""apply/data/prepare.py: real files of every kind through `datasets`, and the errors users cause."""

from __future__ import annotations

import json

import pytest

from gpuplan.apply.data.prepare import prepare_data
from gpuplan.apply.data.tokenizer import EOS_ID, byte_level_tokenizer
from gpuplan.apply.errors import ApplyError
from tests.helpers.apply_plans import CORPUS, SENTIMENT_CSV, SENTIMENT_JSONL, cpu_plan

ROWS = [{"text": f"sample number {i} says {'good' if i % 2 else 'bad'} things", "label": "pos" if i % 2 else "neg"} for i in range(40)]


def _write(tmp_path, kind):
    import pandas as pd

    path = tmp_path / f"rows.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "json":
        path.write_text(json.dumps(ROWS))
    elif kind == "csv":
        pd.DataFrame(ROWS).to_csv(path, index=False)
    elif kind == "parquet":
        pd.DataFrame(ROWS).to_parquet(path)
    elif kind == "txt":
        path.write_text("".join(r["text"] + "\n" for r in ROWS))
    return str(path)


@pytest.mark.parametrize("kind", ["txt", "jsonl", "json", "csv", "parquet"])
def test_every_file_kind_packs_into_seq_len_blocks(tmp_path, kind):
    plan = cpu_plan(tmp_path, **{"data.train_files": [_write(tmp_path, kind)], "data.seq_len": 32})
    data = prepare_data(plan, byte_level_tokenizer())
    total = sum(len(r["text"].encode()) + 1 for r in ROWS)  # bytes + one eos per document
    assert len(data.train) == total // 32
    assert all(len(ids) == 32 for ids in data.train["input_ids"])
    assert data.train["input_ids"][0][:6] == list(b"sample")
    assert EOS_ID in data.train["input_ids"][0]
    batch = data.collator([data.train[0], data.train[1]])
    assert batch["labels"].tolist() == batch["input_ids"].tolist()  # causal LM: labels are the inputs


@pytest.mark.parametrize("path", [SENTIMENT_CSV, SENTIMENT_JSONL])
def test_seq_cls_maps_label_names_to_ids(tmp_path, path):
    plan = cpu_plan(tmp_path, **{"model.task": "seq-cls", "data.train_files": [path], "data.label_field": "label", "data.seq_len": 48})
    data = prepare_data(plan, byte_level_tokenizer())
    assert data.label_names == ["negative", "positive"]
    assert set(data.train["labels"]) == {0, 1}
    assert all(len(x) == 48 for x in data.train["input_ids"])
    first = data.train[0]
    text = "Sadly, the music was excellent and the pie was friendly. I would come back."  # row 1, positive
    assert first["labels"] == 1 and first["input_ids"][: len(text)] == list(text.encode())[:48]


def test_unpacked_causal_lm_pads_and_masks_pad_labels(tmp_path):
    plan = cpu_plan(tmp_path, **{"data.train_files": [_write(tmp_path, "jsonl")], "data.packing": False, "data.seq_len": 64})
    tok = byte_level_tokenizer()
    data = prepare_data(plan, tok)
    assert len(data.train) == len(ROWS)
    batch = data.collator([data.train[0]])
    pad = batch["input_ids"][0] == tok.pad_token_id
    assert pad.any() and (batch["labels"][0][pad] == -100).all()


def test_masked_lm_masks_about_fifteen_percent(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.task": "masked-lm", "data.seq_len": 128})
    data = prepare_data(plan, byte_level_tokenizer(with_mask=True))
    batch = data.collator([data.train[i] for i in range(64)])
    chosen = (batch["labels"] != -100).float().mean().item()
    assert 0.12 < chosen < 0.18


def test_eval_fraction_splits_rows_before_packing(tmp_path):
    plan = cpu_plan(tmp_path, **{"data.eval_fraction": 0.1})
    data = prepare_data(plan, byte_level_tokenizer())
    assert data.eval is not None
    ratio = len(data.eval) / (len(data.train) + len(data.eval))
    assert 0.05 < ratio < 0.15


def test_eval_files(tmp_path):
    plan = cpu_plan(
        tmp_path, **{"data.train_files": [_write(tmp_path, "jsonl")], "data.eval_files": [_write(tmp_path, "csv")], "data.seq_len": 32}
    )
    data = prepare_data(plan, byte_level_tokenizer())
    assert len(data.eval) == len(data.train)  # same rows, another format


def test_missing_file(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(ApplyError, match=r"data.train_files: .*nope.jsonl does not exist"):
        prepare_data(cpu_plan(tmp_path, **{"data.train_files": [missing]}), byte_level_tokenizer())


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ApplyError, match=r"empty.txt is empty"):
        prepare_data(cpu_plan(tmp_path, **{"data.train_files": [str(empty)]}), byte_level_tokenizer())


def test_file_with_header_only_has_no_rows(tmp_path):
    header = tmp_path / "header.csv"
    header.write_text("text,label\n")
    with pytest.raises(ApplyError, match=r"header.csv.*no rows"):
        prepare_data(cpu_plan(tmp_path, **{"data.train_files": [str(header)]}), byte_level_tokenizer())


def test_missing_text_field_names_the_fields_present(tmp_path):
    plan = cpu_plan(tmp_path, **{"data.train_files": [_write(tmp_path, "jsonl")], "data.text_field": "body"})
    with pytest.raises(ApplyError, match=r"data.text_field = 'body'.*fields present: text, label"):
        prepare_data(plan, byte_level_tokenizer())


def test_missing_label_field(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.task": "seq-cls", "data.train_files": [SENTIMENT_CSV], "data.label_field": "sentiment"})
    with pytest.raises(ApplyError, match=r"data.label_field = 'sentiment'.*fields present: text, label"):
        prepare_data(plan, byte_level_tokenizer())


def test_seq_cls_without_label_field(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.task": "seq-cls", "data.train_files": [SENTIMENT_CSV]})
    with pytest.raises(ApplyError, match=r"data.label_field is not set"):
        prepare_data(plan, byte_level_tokenizer())


def test_unknown_suffix_and_mixed_kinds(tmp_path):
    odd = tmp_path / "data.xml"
    odd.write_text("<a/>")
    with pytest.raises(ApplyError, match=r"suffix '.xml'"):
        prepare_data(cpu_plan(tmp_path, **{"data.train_files": [str(odd)]}), byte_level_tokenizer())
    with pytest.raises(ApplyError, match=r"mixes file kinds"):
        prepare_data(cpu_plan(tmp_path, **{"data.train_files": [CORPUS, SENTIMENT_CSV]}), byte_level_tokenizer())


def test_too_little_text_for_one_block(tmp_path):
    small = tmp_path / "small.txt"
    small.write_text("just a few words\n")
    with pytest.raises(ApplyError, match=r"fewer than data.seq_len = 64 tokens"):
        prepare_data(cpu_plan(tmp_path, **{"data.train_files": [str(small)]}), byte_level_tokenizer())
