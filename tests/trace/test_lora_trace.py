"""The trace runs real LoRA and QLoRA steps (peft, bitsandbytes 4-bit layers) and the analytic
estimate matches it; `plan --trace` does the same for a qlora plan."""

from __future__ import annotations

import pytest

from gpuplan.modelinfo import model_facts
from gpuplan.modelinfo.lora_targets import resolve_targets
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.quant4 import linear4bit_bytes
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from tests.helpers.planning import plan_text, spec

pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

TINY = dict(
    model_type="llama",
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=512,
)


@pytest.mark.slow
@pytest.mark.parametrize("method,ckpt", [("lora", False), ("qlora", False), ("qlora", True)])
def test_analytic_matches_the_traced_peft_step(method, ckpt):
    from gpuplan.trace import trace_memory

    facts = model_facts(TINY)
    a = Adapters(method=method, r=8, target_modules=tuple(resolve_targets(facts, "all-linear", [])))
    wl = Workload(2, 128, amp="bf16", optim="adamw_torch_fused", gradient_checkpointing=ckpt, adapters=a)
    traced = trace_memory(TINY, wl)
    analytic = estimate_memory(facts, wl)
    assert abs(analytic.allocated_peak_bytes / traced.allocated_peak_bytes - 1) < 0.03
    if method == "qlora":  # the 4-bit base as bitsandbytes lays it out
        assert analytic.components["weights"] == pytest.approx(traced.components["weights"], rel=0.01)


def test_4bit_layout_of_one_layer():
    # 4096 x 4096 NF4, double quant: 8 MiB packed + 262144 uint8 absmax + offset
    # + 1024 fp32 nested absmax + 16 fp32 code values
    assert linear4bit_bytes(4096 * 4096, True) == 8 * 2**20 + 262144 + 4 + 4 * 1024 + 64
    assert linear4bit_bytes(4096 * 4096, False) == 8 * 2**20 + 4 * 262144 + 64


@pytest.mark.slow
def test_plan_trace_of_a_qlora_plan(tmp_path):
    from gpuplan.trace.plan import trace_plan

    plan = plan_text(
        tmp_path, spec("tiny-llama-cpu", "A100-80GB", data="seq_len = 128", training="effective_batch_size = 4", extra='method = "qlora"')
    )
    traced = trace_plan(plan).memory.traced
    assert abs(traced["analytic_minus_traced_fraction"]) < 0.05
