"""The audit through the real CLI: a clean `gpuplan apply` records it in gpuplan-state.json; a saved plan
whose model section does not match what apply builds stops before step 1 as a gpuplan bug (exit 1, no
traceback) and leaves only what a failed run leaves."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

pytestmark = pytest.mark.slow

from tests.helpers.cli_runs import gpuplan, state  # noqa: E402
from tests.helpers.plan_apply import SFT, random_base, spec_text, write_data  # noqa: E402

CASE = dataclasses.replace(SFT, method="lora", gradient_checkpointing=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return random_base(tmp_path_factory.mktemp("audit-cli"))


def _spec(tmp_path, base):
    data, keys = write_data(CASE, tmp_path)
    path = tmp_path / "spec.toml"
    path.write_text(spec_text(CASE, base, data, keys, tmp_path / "run", max_steps=2))
    return path


def test_a_real_apply_records_the_audit_in_its_state(base, tmp_path):
    spec = _spec(tmp_path, base)
    proc = gpuplan("apply", spec, "--yes", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    audit = state(spec.parent / "run")["results"]["audit"]
    assert audit["stages"] == ["build", "train-begin"] and audit["differed"] == []
    assert audit["checks"] == sum(len(v) for v in audit["checked"].values()) > 40
    begin = {c["key"]: c for c in audit["checked"]["train-begin"]}
    assert begin["training.gradient_checkpointing"] == {"key": "training.gradient_checkpointing", "planned": True, "live": True, "ok": True}
    assert begin["training.gradient_checkpointing_reentrant"]["live"] is False
    assert begin["model.trainable_dtype"]["live"] == ["float32"]
    assert begin["training.optim"]["live"] == ["AdamW", False]


def test_a_plan_that_differs_from_the_live_run_stops_before_step_1(base, tmp_path):
    spec = _spec(tmp_path, base)
    plan_json = tmp_path / "plan.json"
    proc = gpuplan("plan", spec, "--out", plan_json)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(plan_json.read_text())
    real = plan["model"]["trainable_params"]
    plan["model"]["trainable_params"] = real + 1  # what a miscounting planner would write
    out = tmp_path / "run"
    plan_json.write_text(json.dumps(plan))
    proc = gpuplan("apply", plan_json, "--yes", timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "gpuplan bug" in proc.stderr and f"model.trainable_params: planned {real + 1}, live {real}" in proc.stderr, proc.stderr
    st = state(out)
    assert st["status"] == "failed" and st["error"].startswith("gpuplan bug")
    audit = st["results"]["audit"]
    assert audit["stages"] == ["build"]
    assert audit["differed"] == [{"stage": "build", "key": "model.trainable_params", "planned": real + 1, "live": real, "ok": False}]
    # nothing of a run: no metrics, checkpoint or final model, only the state, the log and the data cache
    assert not {"metrics.jsonl", "final"} & set(os.listdir(out)), os.listdir(out)
    assert not [n for n in os.listdir(out) if n.startswith("checkpoint-")]
