"""The tree passes ruff with the configuration in pyproject.toml (CI installs ruff with the test extra)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_passes():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "gpuplan", "tests", "benchmarks"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_format_leaves_the_tree_unchanged():
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "gpuplan", "tests", "benchmarks"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
