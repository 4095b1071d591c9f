"""Fixtures shared by the tests. Helper functions and constants live in tests.helpers
(imported as `from tests.helpers.planning import ENV`), not as top-level modules."""

from __future__ import annotations

import pytest

from tests.helpers.planning import ENV, SPECS

CANNOT_FIT = frozenset({"mistral-7b-24gb.toml"})  # shipped to show the no-fit error


@pytest.fixture(scope="session")
def shipped_plans():
    """name -> Plan for every shipped spec that fits, planned once with the fixed test environment."""
    from gpuplan.plan.build import plan_file

    return {p.name: plan_file(p, environment=ENV) for p in sorted(SPECS.glob("*.toml")) if p.name not in CANNOT_FIT}
