"""Fixtures shared by the tests. Helper functions and constants live in tests.helpers
(imported as `from tests.helpers.planning import ENV`), not as top-level modules.

Every test gets its own empty calibration store and prices file: a run measured by one
test never changes another test's plan, and the user's own files are never touched."""

from __future__ import annotations

import pytest

from tests.helpers.planning import ENV, SPECS

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
