"""`gpuplan init --data`: the format read from the first rows, for every file type apply reads."""

from __future__ import annotations

import csv
import json

import pytest

from gpuplan.errors import GpuplanError
from gpuplan.init.data_source import data_source
from gpuplan.spec.data_format import detect_format, read_rows
from gpuplan.spec.schema import SECTIONS

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.mark.parametrize(
    "rows,fmt,values",
    [
        ([{"text": "a"}, {"text": "b"}], "text", {"data.format": "text", "data.text_field": "text"}),
        ([{"body": "a", "id": 1}], "text", {"data.format": "text", "data.text_field": "body"}),
        ([CHAT, CHAT], "chat", {"data.format": "chat", "data.messages_field": "messages"}),
        ([{"conversation": CHAT["messages"]}], "chat", {"data.format": "chat", "data.messages_field": "conversation"}),
        (
            [{"prompt": "p", "response": "r"}],
            "instruction",
            {"data.format": "instruction", "data.prompt_field": "prompt", "data.response_field": "response"},
        ),
        (
            [{"instruction": "i", "input": "", "output": "o"}],
            "instruction",  # Alpaca
            {"data.format": "instruction", "data.prompt_field": "instruction", "data.response_field": "output"},
        ),
        (
            [{"question": "q", "answer": "a"}],
            "instruction",
            {"data.format": "instruction", "data.prompt_field": "question", "data.response_field": "answer"},
        ),
    ],
)
def test_formats_read_from_the_rows(rows, fmt, values):
    found = detect_format(rows, "x.jsonl")
    assert found.format == fmt and found.values == values
    assert found.summary.startswith("Read from the rows")


def test_preference_pairs_are_recognised_and_said_so():
    rows = [{"prompt": "p", "chosen": "good", "rejected": "bad"}]
    found = detect_format(rows, "prefs.jsonl")
    assert found.format == "preference"
    if "objective" in SECTIONS["training"].model_fields:  # preference tuning exists in this tree
        assert found.values == {"training.objective": "dpo"} and found.objective == "dpo"
    else:
        assert found.values == {"data.format": "instruction", "data.prompt_field": "prompt", "data.response_field": "chosen"}
        assert "preference pairs (prompt, chosen, rejected)" in found.summary
        assert "no preference objective" in found.summary and "does not read 'rejected'" in found.summary
    chats = [{"prompt": "p", "chosen": CHAT["messages"], "rejected": CHAT["messages"]}]
    if "objective" not in SECTIONS["training"].model_fields:
        assert detect_format(chats, "p.jsonl").values == {"data.format": "chat", "data.messages_field": "chosen"}


def test_rows_of_no_known_format_name_their_columns_and_the_fix():
    with pytest.raises(GpuplanError, match=r"--data d.jsonl: rows with columns 'a', 'b' are none of the formats") as e:
        detect_format([{"a": 1, "b": 2}], "d.jsonl")
    assert "gpuplan init without --data" in e.value.diagnostics[0].fix
    with pytest.raises(GpuplanError, match="holds no rows"):
        detect_format([], "empty.jsonl")


def test_every_file_type_apply_reads(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(CHAT) + "\n\n" + json.dumps(CHAT) + "\n")
    (tmp_path / "b.json").write_text(json.dumps([{"prompt": "p", "response": "r"}] * 3))
    (tmp_path / "c.txt").write_text("one line\nanother\n")
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["question", "answer"])
        w.writeheader()
        w.writerow({"question": "q", "answer": "a"})
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": "x"}, {"text": "y"}]), tmp_path / "e.parquet")
    found = {p: detect_format(read_rows(tmp_path / p), p).format for p in ("a.jsonl", "b.json", "c.txt", "d.csv", "e.parquet")}
    assert found == {"a.jsonl": "chat", "b.json": "instruction", "c.txt": "text", "d.csv": "instruction", "e.parquet": "text"}
    assert len(read_rows(tmp_path / "a.jsonl")) == 2


def test_bad_files_are_errors_with_the_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{not json\n')
    with pytest.raises(GpuplanError, match=r"bad.jsonl: line 2 is not JSON"):
        read_rows(tmp_path / "bad.jsonl")
    with pytest.raises(GpuplanError, match=r"suffix '.xlsx' is not a data file"):
        read_rows(tmp_path / "sheet.xlsx")
    with pytest.raises(GpuplanError, match=r"--data nope.jsonl: no such file"):
        data_source("nope.jsonl", cwd=tmp_path, spec_dir=tmp_path)


def test_a_local_file_is_written_relative_to_the_spec(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    (tmp_path / "specs").mkdir()
    values, fmt = data_source("data/chat.jsonl", cwd=tmp_path, spec_dir=tmp_path / "specs")
    assert values == {"data.train_files": ["../data/chat.jsonl"], "data.format": "chat", "data.messages_field": "messages"}
