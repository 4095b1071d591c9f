"""A fix is data (plan/fit/fixes.py Fix: spec values, why, qualifier) said only by plan/fit/fix_words.py, and a
refusal that does not fit carries what would fit as data (NoFitError.options), which init reads
instead of the fix's words (issue 29, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuplan.init.model_source import model_source
from gpuplan.init.starter_fit import fitted_starter
from gpuplan.plan.build import plan_file
from gpuplan.plan.fit.fix_words import fix_line, no_fit_fix, spec_lines
from gpuplan.plan.fit.fixes import Fix, NoFitError
from tests.helpers.planning import ENV

REPO = Path(__file__).resolve().parents[2]


def test_a_fix_is_said_as_its_spec_lines_words_and_reason():
    assert fix_line(Fix("saver", (("training.optim", "auto"),))) == 'training.optim = "auto"'
    assert (
        fix_line(Fix("gpus", (("hardware.count", 8), ("hardware.nodes", 2)), "FSDP full_shard over 16 GPUs"))
        == "hardware.count = 8, hardware.nodes = 2 (FSDP full_shard over 16 GPUs)"
    )
    assert (
        fix_line(Fix("host", (("hardware.host_memory_gib", 512),), qualifier="or more, if the training hosts have that RAM"))
        == "hardware.host_memory_gib = 512 or more, if the training hosts have that RAM"
    )
    assert fix_line(Fix("saver", (("training.use_liger_kernel", True),), "Liger")) == "training.use_liger_kernel = true (Liger)"
    assert spec_lines([("hardware.gpu", "A100-40GB"), ("hardware.memory_gib", None)]) == [
        'hardware.gpu = "A100-40GB"',
        "remove hardware.memory_gib",
    ]
    fixes = (Fix("dtype", (("model.dtype", "bfloat16"),)), Fix("gpu", (("hardware.gpu", "H100-80GB"),)))
    assert no_fit_fix(fixes, ("lora needs ...",), drop_hardware=True) == (
        "add the lines of the fitting method above (lora); "
        'or any one of these fits (checked with the same memory model): model.dtype = "bfloat16"'
    )


@pytest.fixture(scope="module")
def mistral_refusal() -> NoFitError:
    with pytest.raises(NoFitError) as e:
        plan_file(REPO / "specs" / "mistral-7b-24gb.toml", environment=ENV)
    return e.value


def test_a_refusal_that_does_not_fit_carries_each_option_its_fix_names(mistral_refusal):
    """Every option is data, and each is the spec lines the fix prints (the one-key fixes and the
    hardware planned in full)."""
    options = mistral_refusal.options
    assert {"hardware.gpu": "A100-40GB"} in options and {"hardware.count": 2} in options
    fix = mistral_refusal.fix or ""
    for option in options:
        assert all(line in fix for line in spec_lines(list(option.items()))), option
    assert mistral_refusal.no_fit.method == "full"


def test_init_names_the_gpus_of_the_refusals_options_not_of_its_words(tmp_path):
    """init's --gpu suggestions are the options' hardware.gpu values (init/starter_fit.py _plan)."""
    from gpuplan.cli.spec_files import _planner

    out = tmp_path / "70b.toml"
    planner = _planner(out)
    source = model_source(str(REPO / "specs" / "models" / "llama-3.1-70b.json"))
    seen: list[NoFitError] = []

    def plan(text: str):
        try:
            return planner(text)
        except NoFitError as e:
            seen.append(e)
            raise

    with pytest.raises(Exception) as e:
        fitted_starter(source, "RTX-4090", task="causal-lm", spec_path=out, method="auto", data=None, plan=plan)
    gpus = sorted({o["hardware.gpu"] for o in seen[-1].options if "hardware.gpu" in o})
    assert gpus, "the refusal names a GPU that fits"
    note = e.value.diagnostics[-1]
    assert note.fix == "run init again with " + " or ".join(f"--gpu {g}" for g in gpus)
    assert not out.exists()


def test_the_method_rules_reason_is_its_why_alone(tmp_path):
    """model.method = "auto": the reason says why (the change's `before` says "auto"), so init shows it as written."""
    from tests.helpers.planning import plan_text, spec

    plan = plan_text(
        tmp_path, spec("llama-3.1-8b", "RTX-4090", data="seq_len = 1024", training="effective_batch_size = 8", extra='method = "auto"')
    )
    change = next(c for c in plan.changes if c.key == "model.method")
    assert change.before == "auto" and change.rule == "lora.method"
    assert change.reason.startswith("full does not fit (") and "frozen base, not every weight" in change.reason
