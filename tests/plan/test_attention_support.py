"""The attention support table (gpuplan/modelinfo/attention_support.json) is the installed transformers'."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.planning import REPO


@pytest.mark.slow
def test_table_matches_the_installed_transformers():
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "attention_support.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
