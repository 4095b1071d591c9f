"""Tiny finished runs for the after-the-run commands (generate, chat, eval, export), trained by the CLI.

Each trains in seconds on one CPU core: a 2-layer Llama of hidden size 32 (MICRO_LLAMA)
from scratch on a fixed pattern (digits 0-9 over and over) or on one-sentence chat
replies in ChatML. The modules that use them train each once (module fixtures).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from tests.helpers.apply_plans import MICRO_LLAMA

PATTERN = "0123456789"

PATTERN_SPEC = """\
[model]
config = "micro.json"
from_scratch = true

[hardware]
gpu = "cpu"

[data]
train_files = ["pattern.txt"]
eval_fraction = 0.05
seq_len = 32

[training]
effective_batch_size = 8
learning_rate = 1e-2
max_steps = 30
logging_steps = 5
eval_steps = 15
save_steps = 15
seed = 0

[eval]
sample_prompts = ["3456"]
sample_max_new_tokens = 12
{eval_extra}
[output]
dir = "run"
"""

CHAT_SPEC = """\
[model]
config = "micro.json"
from_scratch = true

[hardware]
gpu = "cpu"

[data]
train_files = ["chat.jsonl"]
format = "chat"
chat_template = "chatml"
eval_fraction = 0.05
seq_len = 256

[training]
effective_batch_size = 8
learning_rate = 1e-2
max_steps = 60
logging_steps = 10
eval_steps = 30
save_steps = 30
seed = 0

[eval]
sample_prompts = ["say tiger"]
sample_max_new_tokens = 16
sample_at_eval = true

[output]
dir = "run"
"""

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lamp", "green", "seven"]


def pattern_spec(tmp: Path, eval_extra: str = "") -> Path:
    """A spec training MICRO_LLAMA on lines of the digit pattern; its run goes to tmp/run."""
    (tmp / "micro.json").write_text(json.dumps(MICRO_LLAMA))
    (tmp / "pattern.txt").write_text("\n".join(PATTERN * 3 for _ in range(300)) + "\n")
    spec = tmp / "pattern.toml"
    spec.write_text(PATTERN_SPEC.format(eval_extra=eval_extra))
    return spec


def chat_spec(tmp: Path) -> Path:
    """Two-turn conversations: "say WORD" is answered "ok." first and "ok again." second."""
    (tmp / "micro.json").write_text(json.dumps(MICRO_LLAMA))
    rnd = random.Random(0)
    rows = []
    for _ in range(200):
        turns = []
        for answer in ("ok.", "ok again."):
            turns += [{"role": "user", "content": f"say {rnd.choice(WORDS)}"}, {"role": "assistant", "content": answer}]
        rows.append(json.dumps({"messages": turns}))
    (tmp / "chat.jsonl").write_text("\n".join(rows) + "\n")
    spec = tmp / "chat.toml"
    spec.write_text(CHAT_SPEC)
    return spec


def tree(directory: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file under directory: what a refused command must not change."""
    out = {}
    for root, _, names in os.walk(directory):
        for n in names:
            p = os.path.join(root, n)
            st = os.stat(p)
            out[os.path.relpath(p, directory)] = (st.st_size, st.st_mtime_ns)
    return out
