"""Fixtures shared by the tests. Helper functions and constants live in tests.helpers
(imported as `from tests.helpers.planning import ENV`), not as top-level modules.

Every test gets its own empty calibration store and prices file: a run measured by one
test never changes another test's plan, and the user's own files are never touched."""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from tests.helpers.planning import ENV, SPECS


def _fixed_cpu_probe() -> None:
    """Every CPU plan in the tests (and the CLIs they start) reads these fixed CPU figures,
    not the machine's measured ones (hardware/cpu_probe.py): its outputs stay the same."""
    from gpuplan.hardware.cpu_probe import PROBE_ENV, VERSION, _cpu_model, _omp
    from gpuplan.hardware.detect import _cpu_count

    path = os.path.join(tempfile.mkdtemp(prefix="gpuplan-cpu-probe-"), "cpu-probe.json")
    entry = {
        "version": VERSION,
        "cpu": _cpu_model(),
        "cpus": _cpu_count(),
        "omp_threads": _omp(),
        "fp32_tflops": 0.1,
        "gbyte_per_s": 10.0,
        "threads": 2,
        "measured_at": "fixed by tests/conftest.py",
    }
    with open(path, "w") as f:
        json.dump({"machines": [entry]}, f)
    os.environ[PROBE_ENV] = path


_fixed_cpu_probe()

CANNOT_FIT = frozenset({"mistral-7b-24gb.toml"})  # shipped to show the no-fit error


@pytest.fixture(scope="session")
def shipped_plans():
    """name -> Plan for every shipped spec that fits, planned once with the fixed test environment."""
    from gpuplan.plan.build import plan_file

    return {p.name: plan_file(p, environment=ENV) for p in sorted(SPECS.glob("*.toml")) if p.name not in CANNOT_FIT}


@pytest.fixture(autouse=True)
def _private_user_files(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("userfiles")
    monkeypatch.setenv("GPUPLAN_CALIBRATION_FILE", str(d / "calibration.jsonl"))
    monkeypatch.setenv("GPUPLAN_PRICES_FILE", str(d / "prices.toml"))
