"""Prompt rows and specs for the grpo / rloo apply tests: "word word word -> D =" prompts whose answer column
is the digit D, and rewards beside the spec. Seeded, so every run trains on the same prompts.

The dense reward the runs learn (`lower`: the share of the completion's four characters, one byte token each,
that are lowercase letters) gives the tiny base a signal at every step: its first completions are a mix of
letters, spaces and other bytes (about 1 in 5 a lowercase letter), so the completions of a group differ.
Measured on this base: full fine-tuning at lr 1e-2 goes from 0.19 to 0.97 in 5 steps; LoRA on every linear
layer at lr 5e-2 from 0.19 to 0.94 in 12."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["ping", "pong", "zig", "zag", "tick", "tock"]

REWARDS_PY = '''\
def lower(prompts, completions, **kwargs):
    """The share of the first four characters that are lowercase letters."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [sum("a" <= ch <= "z" for ch in t[:4]) / 4 for t in texts]


def needs_solution(prompts, completions, solution, **kwargs):
    return [float(c.strip() == s) for c, s in zip(completions, solution)]


def crashes(prompts, completions, **kwargs):
    return [len(c.split()[0]) for c in completions]  # an empty completion has no first word
'''


def arrow_rows(n: int = 64, seed: int = 0) -> list[dict[str, str]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        d = rnd.randint(0, 9)
        out.append({"prompt": " ".join(rnd.choice(WORDS) for _ in range(3)) + f" -> {d} =", "answer": str(d)})
    return out


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


SPEC = """\
[model]
name_or_path = "{base}"
method = "{method}"

[lora]
r = 8
target_modules = {targets}

[hardware]
gpu = "cpu"

[data]
train_files = ["{data}"]
seq_len = 32

[training]
objective = "{objective}"
effective_batch_size = 8
learning_rate = {lr}
max_steps = {steps}
logging_steps = 1
save_steps = {save_steps}
seed = 0

[rl]
num_generations = 4
max_prompt_length = 24
max_completion_length = 4
{rl}
{rewards}
[output]
dir = "{out}"
"""

LOWER = '[[rl.rewards]]\nkind = "function"\nfunction = "my_rewards.py:lower"\n'
ANSWER = '[[rl.rewards]]\nkind = "exact-match"\ncolumn = "answer"\npattern = "(\\\\d)"\nname = "answer"\nweight = 0.5\n'


def rl_spec(
    path: Path,
    *,
    base: str,
    data: str,
    out: Path,
    objective: str = "grpo",
    method: str = "full",
    lr: str = "1e-2",
    steps: int = 8,
    save_steps: int = 1000,
    rl: str = "",
    rewards: str = LOWER + "\n" + ANSWER,
    targets: str = '"all-linear"',
) -> Path:
    """A CPU grpo / rloo spec at `path`, its rewards file beside it."""
    (path.parent / "my_rewards.py").write_text(REWARDS_PY)
    path.write_text(
        SPEC.format(
            base=base,
            data=data,
            out=out,
            objective=objective,
            method=method,
            lr=lr,
            steps=steps,
            save_steps=save_steps,
            rl=rl,
            rewards=rewards,
            targets=targets,
        )
    )
    return path
