"""Every fix the fixed-costs note suggests works if followed (issue 30 item 13): planned again with the
suggested keys, the plan keeps them. It suggested `data.packing = true` for a DPO spec, which the plan
then turns back off (TRL pads each preference batch: plan/rules/data.py)."""

from __future__ import annotations

import re

import pytest
import tomllib

from gpuplan.plan.build import plan_file
from tests.helpers.planning import ENV, MODELS
from tests.helpers.preference_rows import kto_rows, pairs, write_jsonl

SPEC = """
[model]
config = "{models}/{model}.json"
[hardware]
gpu = "A100-80GB"
[data]
train_files = ["{data}"]
seq_len = 128
packing = false
{data_extra}
[training]
objective = "{objective}"
effective_batch_size = 8
{batch}
max_steps = 10
[output]
dir = "{out}"
"""


def _note(plan):
    return next(
        (d for d in plan.diagnostics if d.key == "training.per_device_train_batch_size" and d.summary.startswith("fixed costs")), None
    )


def _suggested(fix: str) -> dict[str, dict[str, object]]:
    """The `key = value` pairs of a fix, as plan_file overrides ({"data": {"packing": True}})."""
    out: dict[str, dict[str, object]] = {}
    for key, value in re.findall(r"([a-z_]+\.[a-z_]+) = ([^,(:]+?)(?=[,(:]|$)", fix):
        section, name = key.split(".")
        out.setdefault(section, {})[name] = tomllib.loads(f"v = {value.strip()}")["v"]
    return out


@pytest.mark.parametrize("objective", ["sft", "sft-chat", "dpo", "kto"])
@pytest.mark.parametrize("small_batch", [False, True])
def test_each_fixed_cost_suggestion_plans_with_the_suggestion_in_force(tmp_path, objective, small_batch):
    # a per-device batch of 1 where the objective allows it (TRL's KTOTrainer needs 2 or more)
    batch = f"per_device_train_batch_size = {2 if objective == 'kto' else 1}" if small_batch else ""
    model, data_extra = "tiny-llama-cpu", ""  # launch-bound on an A100: the fixed-costs note is what is under test
    if objective == "sft-chat":  # opt is not a family that keeps packed chat examples apart: padded instead
        objective, model, data_extra = "sft", "opt-125m", 'format = "chat"\nchat_template = "chatml"'
        data = tmp_path / "chat.jsonl"
        turns = [[{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["chosen"]}] for p in pairs(64)]
        write_jsonl(data, [{"messages": t} for t in turns])
    elif objective == "sft":
        data = tmp_path / "corpus.txt"
        data.write_text("".join(f"{' '.join(p.values())}\n" for p in pairs(64)))
    else:
        data = tmp_path / "rows.jsonl"
        write_jsonl(data, pairs(64) if objective == "dpo" else kto_rows(64))
    spec = tmp_path / "spec.toml"
    text = SPEC.format(models=MODELS, model=model, data_extra=data_extra, data=data, objective=objective, batch=batch, out=tmp_path / "run")
    spec.write_text(text)
    plan = plan_file(spec, environment=ENV)
    note = _note(plan)
    assert note is not None, "fixed costs dominate this tiny step: the note is what is under test"
    if note.fix is None:
        assert "no larger per-device batch" in (note.detail or "")
        return
    if objective != "sft" or data_extra:
        assert "data.packing" not in note.fix  # TRL pads preference batches: the plan would turn it back off
    overrides = _suggested(note.fix)
    assert overrides, note.fix
    followed = plan_file(spec, environment=ENV, overrides=overrides)
    for section, values in overrides.items():
        for name, value in values.items():
            assert followed.value(f"{section}.{name}") == value, f"{section}.{name} = {value!r} did not stay in force"
