"""Every test gets its own empty calibration store and prices file: a run measured by one
test never changes another test's plan, and the user's own files are never touched."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_user_files(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("userfiles")
    monkeypatch.setenv("GPUPLAN_CALIBRATION_FILE", str(d / "calibration.jsonl"))
    monkeypatch.setenv("GPUPLAN_PRICES_FILE", str(d / "prices.toml"))
