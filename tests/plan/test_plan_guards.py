"""Issue 11's guards, over the specs the fuzzer generates (tests/helpers/fuzz_strategies.py).

Guard 1: what a plan accepts, apply accepts: the saved plan of every accepted spec
builds its TrainingArguments, accelerate plugins and LR scheduler (tests/helpers/plan_arguments.py).
Guard 2: every reason agrees with the values it names (tests/helpers/reason_oracle.py).
Both also run over every shipped spec and the specs of the review (tests/plan/test_plan_truth.py).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplan.plan.build import plan_file
from gpuplan.plan.types import PlanError
from tests.helpers.fuzz_oracle import write
from tests.helpers.fuzz_strategies import valid_specs
from tests.helpers.fuzz_toml import toml_doc
from tests.helpers.plan_arguments import build_with_scheduler, saved
from tests.helpers.planning import ENV, ENV_NO_BNB, SPECS
from tests.helpers.reason_oracle import check_reasons

EXAMPLES = 40 if os.environ.get("GPUPLAN_FUZZ_PROFILE", "ci") == "ci" else 1000
GUARD = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _plan(path, env):
    try:
        return plan_file(path, environment=env)
    except PlanError:
        return None


@GUARD
@given(data=st.data(), no_bnb=st.booleans())
def test_guard_1_accepted_plans_build_their_arguments(tmp_path_factory, data, no_bnb):
    work = tmp_path_factory.mktemp("g1")
    spec = data.draw(valid_specs(str(work / "out")))
    plan = _plan(write(work, toml_doc(spec)), ENV_NO_BNB if no_bnb else ENV)
    if plan is not None:
        build_with_scheduler(saved(plan))


@GUARD
@given(data=st.data())
def test_guard_2_reasons_agree_with_the_values(tmp_path_factory, data):
    work = tmp_path_factory.mktemp("g2")
    spec = data.draw(valid_specs(str(work / "out")))
    plan = _plan(write(work, toml_doc(spec)), ENV)
    if plan is not None:
        check_reasons(plan)


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.toml")), ids=lambda p: p.name)
def test_guards_on_every_shipped_spec(path):
    plan = _plan(path, ENV)
    if plan is None:
        return  # mistral-7b-24gb.toml: refused, tests/plan/test_plan_truth.py checks its fixes
    build_with_scheduler(saved(plan))
    assert check_reasons(plan) > 0
