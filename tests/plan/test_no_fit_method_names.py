"""The no-fit fix names the adapter methods that fit, and only those (fit/fixes.py no_fit_fix);
init run with a --method that does not fit says the plan's larger GPU as init's --gpu."""

from __future__ import annotations

import re

import pytest

from gpuplan.plan.types import PlanError
from tests.cli.test_cli_init_fmt import gpuplan
from tests.helpers.planning import MODELS, plan_text, spec


def _no_fit(tmp_path, gpu):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec("llama-3.1-8b", gpu, extra='method = "full"', data="seq_len = 2048", training="effective_batch_size = 64"))
    return next(d for d in e.value.diagnostics if d.severity == "error" and "does not fit" in d.summary)


def test_the_fix_names_only_the_methods_that_fit(tmp_path):
    """An 8B on a T4: lora does not fit (37.8 GiB of 14.7), qlora does; the fix said "(lora or qlora)"."""
    d = _no_fit(tmp_path, "T4")
    said = f"{d.summary} {d.detail}"
    assert "qlora needs" in said and "lora needs" not in said.replace("qlora needs", "")
    assert "add the lines of the fitting method above (qlora)" in d.fix
    both = _no_fit(tmp_path, "RTX-4090")  # both fit on a 24 GiB card
    assert "one of the fitting methods above (lora or qlora)" in both.fix


def test_init_with_a_method_that_does_not_fit_names_the_gpu_as_an_init_option(tmp_path):
    out = tmp_path / "full.toml"
    r = gpuplan("init", MODELS / "llama-3.1-8b.json", "--gpu", "T4", "--method", "full", "--out", out)
    assert r.returncode == 1 and not out.exists()
    gpu = re.search(r'hardware\.gpu = "([^"]+)"', r.stderr).group(1)
    assert f"fix: --method auto lets the planner choose full, lora or qlora, whichever fits; or run init again with --gpu {gpu}" in r.stderr
    again = gpuplan("init", MODELS / "llama-3.1-8b.json", "--gpu", gpu, "--method", "full", "--out", out)
    assert again.returncode == 0, again.stderr  # the suggested option works


def test_init_from_a_config_json_does_not_tell_to_apply_next(tmp_path):
    """A config.json has no weights: apply refuses it, so init's "Next" line stops at plan
    (it said "then: gpuplan apply" right under the line saying apply needs weights)."""
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    out = tmp_path / "c.toml"
    r = gpuplan("init", MODELS / "tiny-llama-cpu.json", "--gpu", "cpu", "--data", data, "--out", out)
    assert r.returncode == 0, r.stderr
    assert "apply needs weights" in r.stdout
    assert f"Next: gpuplan plan {out}\n" in r.stdout and "then: gpuplan apply" not in r.stdout
