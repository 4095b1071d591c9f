"""`gpuplan plan --trace` adds the traced peak beside the analytic one."""

import json
import sys

import pytest

from tests.helpers.cli_runs import run
from tests.helpers.planning import SPECS


@pytest.mark.slow
def test_plan_trace_reports_traced_peak_and_difference():
    r = run(
        [sys.executable, "-m", "gpuplan.cli", "plan", str(SPECS / "a100-fp16.toml"), "--trace", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    mem = json.loads(r.stdout)["memory"]
    traced = mem["traced"]
    assert traced["method"] == "traced"
    assert traced["allocated_peak_bytes"] > 0
    assert abs(traced["analytic_minus_traced_fraction"]) < 0.05
    assert any("wall" in n for n in traced["notes"])
