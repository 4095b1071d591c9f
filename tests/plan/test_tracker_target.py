"""report_to trackers are checked where the run trains: at plan time for this machine, at apply for others."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.launch.packages import check_packages
from gpuplan.plan.types import PlanError
from gpuplan.spec.trackers import TRACKERS
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.planning import ENV, plan_text, spec

ENV_NO_WANDB = {**ENV, "trackers": {"tensorboard": True, "wandb": False}}


def _spec(gpu):
    return spec(model="tiny-llama-cpu", gpu=gpu, data="seq_len = 128", training='effective_batch_size = 16\nreport_to = ["wandb"]')


def test_a_plan_for_another_machine_notes_the_tracker_to_install_there(tmp_path):
    plan = plan_text(tmp_path, _spec("A100-80GB"), env=ENV_NO_WANDB)
    [note] = [d for d in plan.diagnostics if d.key == "training.report_to"]
    assert note.severity == "note" and "on the training machines" in note.summary
    assert note.fix == "pip install wandb on every node before `gpuplan apply`"


def test_a_plan_for_this_machine_still_refuses_a_missing_tracker(tmp_path):
    with pytest.raises(PlanError, match="'wandb', which is not installed here"):
        plan_text(tmp_path, _spec("cpu"), env=ENV_NO_WANDB)


def test_apply_checks_the_trackers_on_the_training_machine(tmp_path):
    absent = next(n for n, (mods, _) in TRACKERS.items() if any(find_spec(m) is None for m in mods))
    plan = cpu_plan(
        tmp_path, **{"training.report_to": ["tensorboard", absent]} if find_spec("tensorboard") else {"training.report_to": [absent]}
    )
    with pytest.raises(ApplyError) as e:
        check_packages(plan)
    assert "training.report_to = " in e.value.args[0] and f"pip install {TRACKERS[absent][1]}" in e.value.args[0]
    check_packages(cpu_plan(tmp_path, **{"training.report_to": "none"}))  # nothing asked, nothing missing
