"""A tiny Llama pretrained from scratch and saved, the base the LoRA/QLoRA apply tests fine-tune.

initializer_range 0.2 instead of Llama's 0.02: after a few steps from scratch the weights
are still at their init scale, and with 0.02 every adapter's effect passes through layers
that shrink it ~10x (o_proj, down_proj), so a LoRA barely moves the loss of a model that
young. A real pretrained model's weights are far from that scale.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

from gpuplan.apply.train.execute import execute
from tests.helpers.apply_plans import MICRO_LLAMA, cpu_plan, write_config

# hidden 64 (MICRO_LLAMA has 32): bitsandbytes 0.50's CPU inference repacking of 4-bit weights
# (functional._convert_weight_packed_for_cpu, taken in eval mode on AVX512-BF16 CPUs) needs
# in_features >= its 64-element block and out_features a multiple of 32, as real models have.
BASE_LLAMA = dict(MICRO_LLAMA, hidden_size=64, intermediate_size=128, initializer_range=0.2)


def pretrain_base(tmp: Path, steps: int = 8) -> str:
    """Train BASE_LLAMA on the shipped corpus for `steps` steps; returns its final/ directory."""
    config = write_config(tmp, BASE_LLAMA, "base-llama.json")
    results = execute(
        cpu_plan(tmp, **{"model.config": config, "training.max_steps": steps, "data.seq_len": 32, "output.dir": str(tmp / "pretrain")}),
        echo=lambda s: None,
        progress=False,
    )
    return results["final_model_dir"]


def other_text(path: Path) -> str:
    """Text unlike the pretraining corpus: seeded sequences of six made-up words."""
    rnd = random.Random(0)
    words = ["ping", "pong", "zig", "zag", "tick", "tock"]
    path.write_text("\n".join(" ".join(rnd.choice(words) for _ in range(12)) + "." for _ in range(400)) + "\n")
    return str(path)


def file_hashes(directory: str) -> dict[str, str]:
    """sha256 of every file under `directory`, by relative path."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def finetune_overrides(base_dir: str, text: str, method: str, **extra) -> dict:
    """cpu_plan overrides for an adapter fine-tune of `base_dir` on `text`."""
    return {
        "model.config": None,
        "model.name_or_path": base_dir,
        "model.from_scratch": False,
        "model.method": method,
        "data.train_files": [text],
        "data.seq_len": 32,
        "training.learning_rate": 1e-2,
        "training.max_steps": 12,
        "training.logging_steps": 1,
        **extra,
    }


SPEC = """\
[model]
name_or_path = "{base}"
task = "causal-lm"
method = "{method}"

[lora]
r = {r}
target_modules = ["q_proj", "v_proj"]

[hardware]
gpu = "cpu"

[data]
train_files = ["{text}"]
seq_len = 32

[training]
effective_batch_size = 8
learning_rate = 1e-2
max_steps = {max_steps}
logging_steps = 1
save_steps = 3
seed = 0

[output]
dir = "{out}"
merge_adapter = {merge}
"""


def adapter_spec(
    path: Path, *, base: str, text: str, out: Path, method: str = "lora", r: int = 8, max_steps: int = 6, merge: bool = False
) -> Path:
    """A spec fine-tuning `base` with adapters on CPU; returns its path."""
    path.write_text(SPEC.format(base=base, text=text, out=out, method=method, r=r, max_steps=max_steps, merge=str(merge).lower()))
    return path
