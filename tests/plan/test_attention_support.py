"""The attention support table (gpuplan/modelinfo/attention_support.json) is the installed transformers'."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import cli_runs
from tests.helpers.planning import REPO


@pytest.mark.slow
def test_table_matches_the_installed_transformers():
    # a real process, forked from the worker's server (transformers loaded) as the benchmark scripts are
    r = cli_runs.run(
        [sys.executable, str(REPO / "benchmarks" / "attention_support.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=cli_runs.env(),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _script():
    spec = importlib.util.spec_from_file_location("attention_support", REPO / "benchmarks" / "attention_support.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FLAGS = {"sdpa": True, "flash_attention_2": True, "flex_attention": False}


def test_the_check_names_a_family_whose_flags_changed(capsys):
    script = _script()
    stored = {"transformers": "5.24.0", "families": {"llama": FLAGS, "gpt2": FLAGS}}
    read = {"transformers": "5.25.0", "families": {"llama": {**FLAGS, "flex_attention": True}, "gpt2": FLAGS}}
    assert script.check(read, stored) == 1
    assert "(llama)" in capsys.readouterr().out
    # a family the table lacks, or one the installed release no longer reads, is a difference too
    assert script.check({**read, "families": {"gpt2": FLAGS}}, stored) == 1
    assert "(llama)" in capsys.readouterr().out


def test_a_release_that_changes_no_flags_passes_and_says_which_release_the_table_came_from(capsys):
    script = _script()
    stored = {"transformers": "5.24.0", "families": {"llama": FLAGS, "gpt2": FLAGS}}
    assert script.check({"transformers": "5.25.0", "families": {"llama": FLAGS, "gpt2": FLAGS}}, stored) == 0
    assert "read from 5.24.0, unchanged in 5.25.0" in capsys.readouterr().out
    # the quick check reads a few families and compares only those
    assert script.check({"transformers": "5.25.0", "families": {"gpt2": FLAGS}}, stored, only_read=True) == 0
