"""`gpuplan data`: examples with trained / masked parts, statistics, JSON contract, errors."""

from __future__ import annotations

import json

from gpuplan.cli import main
from tests.helpers.planning import SPECS


def _spec(tmp_path, old: str = "", new: str = ""):
    text = (SPECS / "tiny-chat.toml").read_text().replace('"models/', f'"{SPECS}/models/')
    path = tmp_path / "chat.toml"
    path.write_text(text.replace('"data/', f'"{SPECS}/data/').replace(old, new))
    return str(path)


def test_json_marks_assistant_text_trained_and_user_text_masked(tmp_path, capsys):
    assert main(["data", _spec(tmp_path), "--examples", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["examples"]) == 2
    first = (SPECS / "data" / "chat.jsonl").read_text().splitlines()[0]
    messages = json.loads(first)["messages"]
    segs = out["examples"][0]["segments"]
    trained = "".join(s["text"] for s in segs if s["trained"])
    masked = "".join(s["text"] for s in segs if not s["trained"])
    for m in messages:
        assert m["content"] in (trained if m["role"] == "assistant" else masked)
    assert "<|im_start|>assistant\n" in masked and "<|im_start|>" not in trained
    s = out["stats"]
    assert s["rows"] == 240 and s["examples"] == 240 and s["truncated_rows"] == 0
    assert 0 < s["trained_tokens"] < s["tokens"] <= s["sequences"] * s["seq_len"]
    assert s["packing_efficiency"] == s["tokens"] / (s["sequences"] * s["seq_len"])


def test_text_output_marks_trained_parts_without_colour(tmp_path, capsys):
    assert main(["data", _spec(tmp_path), "-n", "1", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert "[[The capital of Nepal is Kathmandu.<|im_end|>\n]]" in out
    assert "truncated rows      0" in out and "packing efficiency" in out


def test_truncation_is_counted(tmp_path, capsys):
    assert main(["data", _spec(tmp_path, "seq_len = 512", "seq_len = 128"), "-n", "0", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["stats"]
    assert s["truncated_rows"] > 0 and s["seq_len"] == 128


def test_missing_template_is_a_clear_error(tmp_path, capsys):
    assert main(["data", _spec(tmp_path, 'chat_template = "chatml"', "")]) == 1
    err = capsys.readouterr().err
    assert "data.chat_template" in err and "Traceback" not in err
