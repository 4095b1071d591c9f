"""The reward runtime of a grpo / rloo run (gpuplan/apply/train/rewards.py), called as TRL 1.16 calls a reward
(trl/trainer/grpo_trainer.py `_calculate_rewards`): the built-ins on plain and conversational completions, a
user's "file.py:function" loaded from its file, and every way a reward can fail named with the reward, the
file and what went wrong. No model: these are plain functions."""

from __future__ import annotations

import asyncio
import re

import pytest

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.train import rewards
from gpuplan.plan.resolved import RewardEntry


def _entry(kind: str, name: str | None = None, **kw) -> RewardEntry:
    return RewardEntry(kind=kind, weight=kw.pop("weight", 1.0), name=name or kind.replace("-", "_"), **kw)


def _call(fn, completions, **columns):
    n = len(completions)
    return fn(prompts=["p"] * n, completions=completions, completion_ids=[[1] * len(str(c)) for c in completions], **columns)


def test_exact_match_compares_the_answer_with_the_rows_column():
    plain = rewards.exact_match("answer")
    assert _call(plain, [" 7 ", "7.", "8", ""], answer=["7", "7", 8, "7"]) == [1.0, 0.0, 1.0, 0.0]
    grouped = rewards.exact_match("answer", r"=\s*(-?\d+)")
    assert _call(grouped, ["x = 42 ok", "= 41", "no number"], answer=["42", 42, "42"]) == [1.0, 0.0, 0.0]
    chat = [[{"role": "assistant", "content": "= 3"}], [{"role": "assistant", "content": "= 4"}]]
    assert _call(grouped, chat, answer=["3", "3"]) == [1.0, 0.0]  # conversational completions: the message's text
    with pytest.raises(KeyError, match="no column 'answer'"):
        _call(plain, ["7"], solution=["7"])


def test_regex_and_length_rewards():
    fmt = rewards.regex_match(r"^<think>.*</think>")
    assert _call(fmt, ["<think>a</think> 3", "3 <think>a</think>", ""]) == [1.0, 0.0, 0.0]
    penalty = rewards.length_penalty(4)
    out = penalty(prompts=["p"] * 3, completions=["", "", ""], completion_ids=[[1, 2], [1] * 4, [1] * 10])
    assert out == [0.0, 0.0, -1.5]  # -max(0, tokens - 4) / 4


def test_a_user_function_is_loaded_from_its_file_with_the_plans_name(tmp_path):
    (tmp_path / "helper.py").write_text("BONUS = 0.5\n")
    (tmp_path / "my_rewards.py").write_text(
        "from helper import BONUS\n\ndef shout(prompts, completions, **kwargs):\n    return [BONUS + c.count('!') for c in completions]\n"
    )
    entry = _entry("function", name="loud", function=f"{tmp_path}/my_rewards.py:shout")
    fn = rewards.load_function(entry, 0)
    wrapped = rewards.Reward(entry, 0, fn, entry.function_file)
    assert wrapped.__name__ == "loud"  # TRL logs rewards/loud/mean (trl/trainer/utils.py get_callable_name)
    assert _call(wrapped, ["a!", "b"]) == [1.5, 0.5]


@pytest.mark.parametrize(
    ("source", "function", "message"),
    [
        (None, "missing.py:f", r"rl.rewards\[0\].function: the reward file .*missing.py does not exist"),
        ("def score(prompts, completions, **kw):\n    return []\n", "r.py:scor", r"has no function 'scor' \(its functions: score\)"),
        ("import not_a_module_anywhere\n", "r.py:f", r"loading the reward file .*r.py raised ModuleNotFoundError"),
        ("def f(completions):\n    return []\n", "r.py:f", r"takes \(completions\), not TRL's reward signature"),
        ("f = 3\n", "r.py:f", r"is a int, not a function"),
    ],
)
def test_a_function_that_cannot_be_used_is_refused_with_the_key_and_the_fix(tmp_path, source, function, message):
    if source is not None:
        (tmp_path / "r.py").write_text(source)
    entry = _entry("function", function=f"{tmp_path}/{function}")
    with pytest.raises(ApplyError, match=message) as e:
        rewards.load_function(entry, 0)
    assert e.value.key == "rl.rewards[0].function" and e.value.fix
    if "scor" in function:
        assert e.value.fix.startswith("did you mean 'score'?")


def test_a_function_naming_every_keyword_needs_no_kwargs(tmp_path):
    (tmp_path / "r.py").write_text(
        "def f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, answer):\n    return [0.0] * len(prompts)\n"
    )
    assert callable(rewards.load_function(_entry("function", function=f"{tmp_path}/r.py:f"), 0))


def test_a_reward_that_raises_or_returns_garbage_is_named(tmp_path):
    entry = _entry("function", name="judge", function=f"{tmp_path}/judge.py:judge")

    def boom(prompts, completions, **kwargs):
        return [1 / 0 for _ in completions]

    wrapped = rewards.Reward(entry, 2, boom, f"{tmp_path}/judge.py")
    with pytest.raises(rewards.RewardError) as e:
        _call(wrapped, ["a"])
    text = e.value.summary
    assert text.startswith(f"rl.rewards[2]: reward 'judge' ({tmp_path}/judge.py) raised ZeroDivisionError: division by zero")
    assert text.endswith("on the first batch") and e.value.key == "rl.rewards[2]"
    for bad, what in (
        (lambda **kw: 1.0, "returned float on the first batch, not a list"),
        (lambda **kw: [1.0, 2.0], "returned 2 values for 1 completions"),
        (lambda **kw: ["x"], "returned 'x' (str)"),
    ):
        with pytest.raises(rewards.RewardError, match=re.escape(what)):
            _call(rewards.Reward(entry, 2, bad, "f"), ["a"])
    assert _call(rewards.Reward(entry, 2, lambda **kw: [None, 2], "f"), ["a", "b"]) == [None, 2.0]  # None: not scored


def test_an_async_reward_stays_async_for_trls_event_loop(tmp_path):
    from trl.trainer.utils import is_async_callable

    (tmp_path / "r.py").write_text("async def judge(prompts, completions, **kwargs):\n    return [len(c) for c in completions]\n")
    plan_entry = _entry("function", function=f"{tmp_path}/r.py:judge")
    fn = rewards.load_function(plan_entry, 0)
    wrapped = rewards.AsyncReward(plan_entry, 0, fn, str(tmp_path / "r.py"))
    assert is_async_callable(wrapped)
    assert asyncio.run(wrapped(prompts=["p"], completions=["abc"], completion_ids=[[1]])) == [3.0]


def test_the_first_batch_call_is_trls_call_with_the_rows_columns():
    batch = [{"prompt": "a ->", "answer": "1", "completion": "x"}, {"prompt": "b ->", "answer": "2", "completion": "y"}]
    prompts, completions, kwargs = rewards.reward_call(batch)
    assert prompts == ["a ->", "b ->"] and completions == ["", ""]
    assert kwargs["answer"] == ["1", "2"] and "completion" not in kwargs  # TRL passes no completion column
    assert set(kwargs) == {"answer", *rewards.TRL_KEYWORDS}
    chat = [{"prompt": [{"role": "user", "content": "hi"}]}]
    _, completions, _ = rewards.reward_call(chat)
    assert completions == [[{"role": "assistant", "content": ""}]]
