"""One error model: every user-facing error carries key, summary, detail and fix."""

import dataclasses

import pytest

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.train.arguments import training_arguments
from gpuplan.cli.common import UserError
from gpuplan.errors import GpuplanError
from gpuplan.lifecycle.run_lock import LockError
from gpuplan.plan.types import PlanError
from tests.helpers.apply_plans import cpu_plan


def test_every_user_facing_error_is_one_type_with_the_diagnostic_fields():
    assert PlanError is GpuplanError
    for cls in (ApplyError, LockError, UserError):
        e = cls("output.dir is in use", key="output.dir", fix="wait for it")
        assert isinstance(e, GpuplanError)
        assert (e.key, e.summary, e.detail, e.fix) == ("output.dir", "output.dir is in use", None, "wait for it")
        assert str(e) == e.message == "output.dir is in use; wait for it"


def test_a_transformers_refusal_names_a_next_step(tmp_path):
    plan = cpu_plan(tmp_path, **{"training.logging_steps": 0})
    with pytest.raises(ApplyError, match="refused by transformers.*logging_steps") as e:
        training_arguments(plan)
    assert e.value.fix == "change the setting the message names in the spec, then re-run `gpuplan plan`"
    old = dataclasses.replace(plan, fingerprint={"versions": {"transformers": "4.0.0"}})
    with pytest.raises(ApplyError) as e:
        training_arguments(old)
    assert e.value.fix.startswith("the plan was made for transformers 4.0.0 and ")


def test_convert_errors_carry_their_key(tmp_path):
    plan = cpu_plan(tmp_path, **{"distributed.strategy": "fsdp", "distributed.fsdp_sharding": "hybrid_shard", "hardware.count": 2})
    with pytest.raises(ApplyError, match="not applied by gpuplan yet") as e:
        training_arguments(plan)
    assert e.value.key == "distributed.fsdp_sharding" and "full_shard" in e.value.fix
