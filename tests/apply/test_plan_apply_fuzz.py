"""Randomized plan -> apply, the CI draw (issue 30): a few seeded specs across objective x method x
savers x data format x precision (tests/helpers/plan_apply.py), each refused at plan time with a clear
error or applied for one step on CPU with the audit passing; never "plan succeeded, apply failed".
The long profile is benchmarks/plan_apply_fuzz.py (counts in benchmarks/RESULTS.md).

A case whose failure comes from an open issue-30 defect is xfail(strict=True) with its number: when
the defect is fixed the case passes, strict turns that into a failure, and the marker goes."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

from tests.helpers import plan_apply  # noqa: E402

SEED = 74


class KnownCause(Exception):
    """The case failed from the cause its xfail names (any other failure fails the test)."""


CASES = plan_apply.cases(4, SEED)


def _param(case: plan_apply.Case):
    cause = plan_apply.known_defect(case)
    why = f"issue 30 defect {cause}" if isinstance(cause, int) else cause
    marks = [pytest.mark.xfail(strict=True, raises=KnownCause, reason=why)] if cause else []
    return pytest.param(case, id=case.label, marks=marks)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return plan_apply.random_base(tmp_path_factory.mktemp("fuzz-base"))


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_refused_at_plan_or_applied_with_the_audit_passing(case, base, tmp_path):
    outcome = plan_apply.run(case, tmp_path, base)
    if outcome.result == "failed" and outcome.known_defect is not None and outcome.known_defect == plan_apply.known_defect(case):
        raise KnownCause(outcome.detail)
    assert outcome.result in ("refused", "applied"), outcome.detail
    assert plan_apply.known_defect(case) is None  # an expected failure that did not happen: remove its xfail
    if outcome.result == "applied":
        assert outcome.checks > 30
