"""The published rows as the fit plans them (benchmarks/published_rows.py): a GPTQ row's kernels are auto-gptq's."""

from __future__ import annotations

import dataclasses
import re
import sys

from gpuplan.plan.estimate.step_time import shape as S
from tests.helpers.cli_runs import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import published_rows  # noqa: E402


def _kernels(out: dict) -> int:
    term = next(t for t in out["step_time"]["terms"] if t["name"] == "kernel launches")
    return int(re.match(r"([\d,]+) kernels", term["formula"]).group(1).replace(",", ""))


def test_a_gptq_row_launches_auto_gptqs_eager_dequantization_kernels_and_the_count_is_put_back():
    runs, _ = published_rows.usable_runs()
    gptq = next(r for r in runs if r.gptq and r.workload.gradient_checkpointing)
    as_bnb = dataclasses.replace(gptq, gptq=False)  # the same row planned as bitsandbytes NF4
    layers = gptq.facts.num_layers
    before = S.DEQUANT_KERNELS
    with_gptq, with_bnb = _kernels(published_rows.predict(gptq)), _kernels(published_rows.predict(as_bnb))
    assert S.DEQUANT_KERNELS == before  # predict() restores the plan's own count
    # bitsandbytes: DEQUANT_KERNELS per pass (3 under checkpointing) on the 7 linears of the Llama-shaped facts;
    # auto-gptq: 9 per forward on Qwen's 5 linears, forward and recomputed forward
    bnb_dequant = layers * S.DEQUANT_KERNELS * 3 * 7
    gptq_dequant = layers * published_rows.GPTQ_EAGER_KERNELS * 2 * published_rows.QWEN_LINEARS_PER_LAYER
    assert gptq_dequant == layers * 90
    assert abs(with_gptq - (with_bnb - bnb_dequant + gptq_dequant)) <= 1  # int() of the plan's fractional count
