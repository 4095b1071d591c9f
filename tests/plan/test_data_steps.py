"""The optimizer steps the training data gives, counted at plan time (spec/data_steps.py).

The plan's count is checked against what apply really builds (apply/data/prepare.py prepare_data with
the run's tokenizer), over randomized corpora and settings; a batch the data cannot fill is
refused with a fix that plans; init sizes its starter batch to a small file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpuplan.plan.types import PlanError
from gpuplan.spec.data_steps import data_size, optimizer_steps_per_epoch
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.cli_runs import gpuplan
from tests.helpers.planning import plan_text

WORDS = "the a cat dog sat ran on under mat tree and then it was very happy today why not".split()


def _corpus(r: random.Random, docs: int, blank_every: int) -> str:
    lines = []
    for i in range(docs):
        lines.append("" if blank_every and i % blank_every == 0 else " ".join(r.choice(WORDS) for _ in range(r.randint(1, 90))))
    return "\n".join(lines) + "\n"


def _llama_dir(tmp_path: Path) -> str:
    from tests.helpers.llama_tokenizer import llama_tokenizer

    d = tmp_path / "tok"
    llama_tokenizer().save_pretrained(d)
    assert (d / "tokenizer.json").is_file()
    return str(d)


@pytest.mark.parametrize("seed", range(6))
def test_the_plans_count_is_the_sequences_apply_builds(tmp_path, seed):
    from gpuplan.apply.data.prepare import prepare_data
    from gpuplan.apply.data.tokenizer import load_tokenizer

    r = random.Random(seed)
    own_tokenizer = seed % 2 == 1  # the model directory's tokenizer.json, or the byte-level one
    source = _llama_dir(tmp_path) if own_tokenizer else None
    suffix = r.choice([".txt", ".jsonl"])
    text = _corpus(r, r.randint(3, 2500), r.choice([0, 7]))
    path = tmp_path / f"train{suffix}"
    if suffix == ".txt":
        path.write_text(text)
    else:
        path.write_text("".join(json.dumps({"body": t}) + "\n" for t in text.splitlines()))
    settings = {
        "data.train_files": [str(path)],
        "data.seq_len": r.choice([16, 64, 128]),
        "data.packing": r.random() < 0.7,
        "data.text_field": "body" if suffix == ".jsonl" else "text",
        "model.name_or_path": source,
    }
    plan = cpu_plan(tmp_path, **settings)
    tok = load_tokenizer(source, task="causal-lm", from_scratch=True)
    live = len(prepare_data(plan, tok).train)
    values = {k: plan.settings[k].value for k in plan.settings if k.startswith("data.") or k == "training.objective"}
    size = data_size(values, str(tmp_path), source=source, from_scratch=True)
    assert size is not None and size.exact, size
    assert size.sequences == live, (size, live, settings)


def test_an_eval_split_is_counted_within_a_block(tmp_path):
    from gpuplan.apply.data.prepare import prepare_data
    from gpuplan.apply.data.tokenizer import load_tokenizer

    path = tmp_path / "train.txt"
    path.write_text(_corpus(random.Random(7), 800, 0))
    plan = cpu_plan(tmp_path, **{"data.train_files": [str(path)], "data.eval_fraction": 0.1, "data.seq_len": 64})
    live = len(prepare_data(plan, load_tokenizer(None, task="causal-lm", from_scratch=True)).train)
    values = {k: plan.settings[k].value for k in plan.settings if k.startswith("data.") or k == "training.objective"}
    size = data_size(values, str(tmp_path), source=None, from_scratch=True)
    assert size is not None and "720 of 800 rows after the eval split" in size.basis
    assert abs(size.sequences - live) <= max(2, live // 50), (size, live)


def test_steps_per_epoch_follow_the_trainers_formula():
    # transformers 5.24 Trainer.set_initial_training_values: ceil over the accumulation, at least one
    assert optimizer_steps_per_epoch(135, 8, 32, 1) == 1  # 17 micro-batches: one partial step
    assert optimizer_steps_per_epoch(135, 8, 2, 1) == 9
    assert optimizer_steps_per_epoch(100, 4, 1, 2) == 13  # 50 per rank, 13 micro-batches
    assert optimizer_steps_per_epoch(1, 8, 4, 1) == 1


def _small_spec(tmp_path: Path, batch: int, lines: int = 40) -> str:
    (tmp_path / "small.txt").write_text(_corpus(random.Random(3), lines, 0))
    return f"""
[model]
config = "{Path(__file__).resolve().parents[2] / "specs/models/tiny-llama-cpu.json"}"
from_scratch = true
[hardware]
gpu = "cpu"
[data]
train_files = ["small.txt"]
seq_len = 128
[training]
effective_batch_size = {batch}
num_train_epochs = 3
[output]
dir = "{tmp_path / "run"}"
"""


def test_a_batch_the_data_cannot_fill_is_refused_and_its_fix_plans(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, _small_spec(tmp_path, 256))
    d = next(d for d in e.value.diagnostics if d.key == "training.effective_batch_size")
    assert d.severity == "error" and "fewer than one optimizer step's effective batch of 256" in d.summary, d
    assert "counted with the byte-level tokenizer" in (d.detail or "")
    fixed = d.fix_values["training.effective_batch_size"]
    assert f"set training.effective_batch_size = {fixed}" in d.fix
    plan = plan_text(tmp_path, _small_spec(tmp_path, fixed))  # the fix, followed, plans
    note = next(d for d in plan.diagnostics if d.key == "training.num_train_epochs")
    steps = int(note.summary.split("gives ")[1].split()[0])
    assert steps >= 8 and "over 3 epoch(s)" in note.summary, note


def test_a_batch_from_an_estimate_only_warns(tmp_path):
    spec = _small_spec(tmp_path, 256).replace("from_scratch = true", "from_scratch = false")
    spec = spec.replace('config = "', 'name_or_path = "').replace("tiny-llama-cpu.json", "")  # a directory without tokenizer.json
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text((Path(__file__).resolve().parents[2] / "specs/models/tiny-llama-cpu.json").read_text())
    spec = spec.replace(str(Path(__file__).resolve().parents[2] / "specs/models") + "/", str(tmp_path / "model"))
    plan = plan_text(tmp_path, spec)
    d = next(d for d in plan.diagnostics if d.key == "training.effective_batch_size" and d.severity == "warning")
    assert "about" in d.summary and "estimated at 4 bytes per token" in d.detail


def test_init_sizes_the_starter_batch_to_a_small_file(tmp_path):
    (tmp_path / "small.txt").write_text(_corpus(random.Random(5), 150, 0))
    model = Path(__file__).resolve().parents[2] / "specs/models/tiny-llama-cpu.json"
    r = gpuplan("init", str(model), "--gpu", "cpu", "--data", "small.txt", "--out", "g.toml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "g.toml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("effective_batch_size"))
    batch = int(line.split("=")[1].split()[0])
    assert batch < 256 and "# Sized to the data: the data holds about" in text, text
    r = gpuplan("plan", "g.toml", cwd=tmp_path)
    assert r.returncode == 0 and "fewer than one optimizer step" not in r.stdout + r.stderr, r.stdout + r.stderr
