"""Synthetic preference rows for the DPO / KTO apply tests: the chosen answer follows a rule
(it repeats the prompt's words in order), the rejected one breaks it (another order, one word
replaced). Seeded, so every test run trains on the same pairs."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["ping", "pong", "zig", "zag", "tick", "tock"]


def pairs(n: int = 64, seed: int = 7) -> list[dict[str, str]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        words = rnd.sample(WORDS, 3)
        wrong = [words[2], rnd.choice([w for w in WORDS if w not in words]), words[0]]
        out.append({"prompt": " ".join(words) + " ->", "chosen": " " + " ".join(words) + ".", "rejected": " " + " ".join(wrong) + "."})
    return out


def kto_rows(n: int = 64, seed: int = 7) -> list[dict]:
    """KTO's unpaired rows: each pair becomes a desirable and an undesirable completion."""
    out = []
    for p in pairs(n // 2, seed):
        out.append({"prompt": p["prompt"], "completion": p["chosen"], "label": True})
        out.append({"prompt": p["prompt"], "completion": p["rejected"], "label": False})
    return out


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def conversational(rows: list[dict[str, str]]) -> list[dict]:
    """The same pairs as conversations: a user prompt, the assistant's chosen / rejected turn."""
    return [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "chosen": [{"role": "assistant", "content": r["chosen"].strip()}],
            "rejected": [{"role": "assistant", "content": r["rejected"].strip()}],
        }
        for r in rows
    ]


SPEC = """\
[model]
name_or_path = "{base}"
method = "{method}"

[lora]
r = 8
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]

[hardware]
gpu = "cpu"

[data]
train_files = ["{data}"]
seq_len = 48

[training]
objective = "{objective}"
effective_batch_size = 8
learning_rate = {lr}
max_steps = {steps}
logging_steps = 1
save_steps = {save_steps}
seed = 0
{extra}
[output]
dir = "{out}"
"""


def preference_spec(
    path: Path,
    *,
    base: str,
    data: str,
    out: Path,
    objective: str = "dpo",
    method: str = "full",
    lr: str = "1e-3",
    steps: int = 16,
    save_steps: int = 1000,
    extra: str = "",
) -> Path:
    path.write_text(
        SPEC.format(
            base=base, data=data, out=out, objective=objective, method=method, lr=lr, steps=steps, save_steps=save_steps, extra=extra
        )
    )
    return path
