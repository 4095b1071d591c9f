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


def test_the_trainers_per_step_cost_is_fitted_only_where_a_source_sweeps_the_accumulation_steps():
    """ms-swift's rows run 1 to 64 accumulation steps: with them the per-step cost is separable from a per-micro-batch
    one; Qwen's (8 only) and fms-acceleration's (1 only) are not, so a fold of those keeps the measured prior; a class
    split that does not match the rows stops the fit."""
    runs, _ = published_rows.usable_runs()
    by = {s: [r for r in runs if published_rows.source_name(r.row) == s] for s in {published_rows.source_name(r.row) for r in runs}}
    i = F.NAMES.index("TRAINER_STEP_S")
    prior = [p.prior for p in F.PARAMS]
    swift, qwen, fms = by["modelscope/ms-swift"], by["QwenLM/Qwen"], by["foundation-model-stack/fms-acceleration"]
    assert F.sweeps_accumulation(swift) and not F.sweeps_accumulation(qwen + fms)
    shipped = F.current()
    try:
        assert F.identified(qwen[:3] + swift[:40], prior)[i]
        assert not F.identified(qwen[:3] + fms[:3], prior)[i]
        assert F.identified(qwen[:3] + fms[:3], prior)[F.NAMES.index("KERNEL_S")]  # the rule is the Trainer's alone
    finally:
        F.apply(shipped)
    F.check_classes(runs)
    with pytest.raises(SystemExit, match=r"ampere \(0 rows\)"):
        F.check_classes([r for r in runs if published_rows.source_name(r.row) != "AnswerDotAI/fsdp_qlora"])
