"""The step-time fit's own machinery (benchmarks/fit_step_time.py): the prior term and the side-by-side fits."""

from __future__ import annotations

import math
import sys

import pytest

from tests.helpers.cli_runs import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import fit_step_time as F  # noqa: E402
import published_rows  # noqa: E402


def test_the_prior_term_is_zero_at_the_priors_grows_with_the_distance_in_sigmas_and_weighs_less_with_more_rows():
    prior = [p.prior for p in F.PARAMS]
    assert F.prior_term(prior, 100) == 0
    i = F.NAMES.index("TRAINER_STEP_S")
    p = F.PARAMS[i]
    moved = list(prior)
    moved[i] = p.prior * math.exp(2 * F.sigma(p))  # two sigmas off: z^2 / 2 = 2
    assert F.prior_term(moved, 100) == pytest.approx(F.PRIOR_SCALE / 100 * 2)
    assert F.prior_term(moved, 200) == pytest.approx(F.prior_term(moved, 100) / 2)
    # sigma: a quarter of the bounds' log-span unless the Param names its own width (profile() holds a constant by its
    # bounds but keeps the prior's width, so the held constant's prior term is the fold's)
    assert F.sigma(p) == pytest.approx(math.log(p.upper / p.lower) / 4)
    held = F.Param(p.name, 1e-3, 1.0001e-3, p.prior, p.why, math.log(p.upper / p.lower))
    assert F.sigma(held) == F.sigma(p)


def test_fits_run_side_by_side_give_what_they_give_one_after_another():
    runs, _ = published_rows.usable_runs()
    few = [r for r in runs if published_rows.source_name(r.row) in ("pytorch/torchtitan", "AnswerDotAI/fsdp_qlora")]
    kept, shipped = F._RUNS, F.current()
    F._RUNS = few
    try:
        calls = [("fit", 3, None), ("fold", "pytorch/torchtitan", 3, "a seed", ())]
        serial = F.run_jobs(calls, 1)
        parallel = F.run_jobs(calls, 2)
    finally:
        F._RUNS = kept
        F.apply(shipped)  # the serial fits set the module's constants: the shipped ones back for the next test
    assert parallel == serial
    (values, free, _, _), errs = serial[1]
    assert len(errs) == sum(published_rows.source_name(r.row) == "pytorch/torchtitan" for r in few)
    assert len(values) == len(free) == len(F.PARAMS)
    assert F.current() == shipped
