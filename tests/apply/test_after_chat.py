"""chat and generate on a chat run: the trained ChatML template, kept turns, and its export.

The run (60 steps, seconds) learns to answer "ok." to the first "say WORD" of a
conversation and "ok again." to the second; only a model that sees the conversation in
the template it was trained on, with the earlier turns, answers both right.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import cli_runs
from tests.helpers.after_runs import chat_spec
from tests.helpers.apply_plans import read_jsonl
from tests.helpers.cli_runs import command, env, gpuplan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    spec = chat_spec(tmp)
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    return spec, tmp / "run"


def test_generate_renders_the_prompt_with_the_trained_template(run):
    spec, _ = run
    r = gpuplan("generate", spec, "--prompt", "say cloud", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    g = json.loads(r.stdout)["generations"][0]
    assert g["text"] == "<|im_start|>user\nsay cloud<|im_end|>\n<|im_start|>assistant\n"
    assert g["completion"] == "ok."  # cut at the template's end of turn, "<|im_end|>"
    assert g["new_tokens"] == len("ok.<|im_end|>")  # stopped there: the byte-level tokenizer, one byte a token


def test_chat_keeps_the_turns_until_end_of_input(run):
    spec, _ = run
    r = cli_runs.run(command("chat", spec), input="say stone\nsay lamp\n", env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["ok.", "ok again."]  # the second answer needs the first turn


def test_chat_commands_are_not_sent_to_the_model(run):
    """/help and an unknown /word are answered by gpuplan, /reset forgets, /quit ends the chat: none
    is a turn of the conversation (the model answers "ok." to a first turn, "ok again." to a second)."""
    spec, _ = run
    lines = "/help\nsay stone\n/reset\n/hlep\nsay lamp\n/quit\nsay cloud\n"
    r = cli_runs.run(command("chat", spec), input=lines, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["ok.", "ok."]  # after /reset "say lamp" is a first turn again; nothing after /quit
    assert "commands: /reset forgets the conversation, /quit (or Ctrl-D) ends the chat" in r.stderr
    assert "(unknown command /hlep;" in r.stderr


def test_samples_at_every_eval_and_at_the_end(run):
    _, out = run
    samples = [(r["step"], r["at"]) for r in read_jsonl(out / "metrics.jsonl") if r["event"] == "sample"]
    assert samples == [(30, "eval"), (60, "eval"), (60, "end")]


def test_export_carries_the_chat_template(run, tmp_path):
    from transformers import AutoTokenizer

    spec, _ = run
    dest = tmp_path / "chat-model"
    r = gpuplan("export", spec, "--to", dest)
    assert r.returncode == 0, r.stderr[-2000:]
    tok = AutoTokenizer.from_pretrained(dest)
    msgs = [{"role": "user", "content": "say cloud"}]
    assert (
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        == "<|im_start|>user\nsay cloud<|im_end|>\n<|im_start|>assistant\n"
    )
