"""The analytic memory estimate: pure, fast, parts add up, moves the right way."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuplan.modelinfo import model_facts
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.states import adafactor_state_bytes, bnb_state_bytes, optimizer_kind
from gpuplan.plan.estimate.memory.types import COMPONENTS, Workload

MODELS = Path(__file__).resolve().parents[2] / "specs" / "models"


@pytest.fixture(scope="module")
def llama8b():
    return model_facts(json.loads((MODELS / "llama-3.1-8b.json").read_text()), "causal-lm")


@pytest.fixture(scope="module")
def gpt2():
    return model_facts(json.loads((MODELS / "gpt2.json").read_text()), "causal-lm")


WORKLOADS = [
    Workload(4, 2048, amp="bf16"),
    Workload(1, 4096, weight_dtype="bfloat16", optim="adamw_8bit", gradient_checkpointing=True),
    Workload(8, 512, amp="fp16", optim="adafactor", attn_implementation="eager"),
    Workload(2, 1024, optim="sgd", gradient_accumulation_steps=4),
    Workload(2, 1024, optim="adamw_torch_fused", device="cpu"),
]


@pytest.mark.parametrize("wl", WORKLOADS, ids=lambda w: f"{w.optim}-{w.amp}-{w.weight_dtype}")
def test_components_add_up(llama8b, wl):
    est = estimate_memory(llama8b, wl)
    assert set(est.components) == set(COMPONENTS)
    assert sum(est.components.values()) == est.reserved_peak_bytes
    assert sum(v for k, v in est.components.items() if k != "overhead") == est.allocated_peak_bytes
    assert est.method == "analytic"
    assert all(v >= 0 for v in est.components.values())


def test_cpu_has_no_overhead(gpt2):
    est = estimate_memory(gpt2, Workload(2, 256, device="cpu"))
    assert est.components["overhead"] == 0
    assert est.reserved_peak_bytes == est.allocated_peak_bytes
    assert estimate_memory(gpt2, Workload(2, 256)).components["overhead"] > 0


def test_fast_enough_for_the_solver(llama8b):
    wl = Workload(4, 2048, amp="bf16", optim="adamw_8bit")
    estimate_memory(llama8b, wl)  # warm the per-facts cache
    t0 = time.perf_counter()
    for _ in range(200):
        estimate_memory(llama8b, wl)
    per_call = (time.perf_counter() - t0) / 200
    assert per_call < 1e-3, f"{per_call * 1e6:.0f} us per call"


@pytest.mark.parametrize("field,low,high", [("per_device_batch", 1, 8), ("seq_len", 512, 4096)])
def test_more_tokens_more_memory(llama8b, field, low, high):
    base = dict(per_device_batch=2, seq_len=1024, amp="bf16")
    a = estimate_memory(llama8b, Workload(**{**base, field: low}))
    b = estimate_memory(llama8b, Workload(**{**base, field: high}))
    assert b.allocated_peak_bytes > a.allocated_peak_bytes


def test_checkpointing_saves_activations(llama8b):
    off = estimate_memory(llama8b, Workload(8, 2048, amp="bf16"))
    on = estimate_memory(llama8b, Workload(8, 2048, amp="bf16", gradient_checkpointing=True))
    assert on.allocated_peak_bytes < off.allocated_peak_bytes
    assert on.components["activations"] < off.components["activations"] / 3


def test_optimizer_order(llama8b):
    peak = {
        o: estimate_memory(llama8b, Workload(1, 512, amp="bf16", optim=o)).components["optimizer_states"]
        for o in ("adamw_torch", "adamw_8bit", "adafactor", "sgd")
    }
    assert peak["adamw_torch"] > peak["adamw_8bit"] > peak["adafactor"] > peak["sgd"] == 0
    # AdamW: two fp32 states per parameter (8 bytes) plus a 4-byte step per tensor
    assert peak["adamw_torch"] == 8 * llama8b.n_params + 4 * len(llama8b.param_shapes)


def test_pure_bf16_halves_the_states(llama8b):
    fp32 = estimate_memory(llama8b, Workload(1, 512, optim="adamw_torch_fused"))
    bf16 = estimate_memory(llama8b, Workload(1, 512, weight_dtype="bfloat16", optim="adamw_torch_fused"))
    assert bf16.components["weights"] * 2 == fp32.components["weights"]


def test_unknown_optimizer_is_adamw_with_a_note(gpt2):
    est = estimate_memory(gpt2, Workload(1, 128, optim="my_optimizer"))
    ref = estimate_memory(gpt2, Workload(1, 128, optim="adamw_torch"))
    assert est.allocated_peak_bytes == ref.allocated_peak_bytes
    assert any("my_optimizer" in n for n in est.notes)


def test_optimizer_kinds():
    assert optimizer_kind("adamw_torch_fused") == ("adamw_fused", None)
    assert optimizer_kind("paged_adamw_8bit")[0] == "bnb8:2"
    assert optimizer_kind("lion_8bit")[0] == "bnb8:1"
    assert optimizer_kind("sgd")[0] == "sgd"


def test_bnb_layout_by_hand():
    # 4096 x 4096: 2 uint8 states + fp32 absmax per 256 values each; a 4095-element
    # tensor (< min_8bit_size) keeps two fp32 states; plus the two shared 256-entry maps
    shapes = (("w", (4096, 4096)), ("b", (4095,)))
    n = 4096 * 4096
    assert bnb_state_bytes(shapes, 2, True) == 2 * (n + 4 * (n // 256)) + 2 * 4 * 4095 + 2 * 256 * 4
    assert bnb_state_bytes(shapes, 2, False) == 2 * 4 * (n + 4095)


def test_adafactor_layout_by_hand():
    # factored row + column for matrices, full for vectors, fp32; plus 4 bytes slack per tensor
    assert adafactor_state_bytes((("w", (300, 200)), ("b", (200,)))) == 4 * (300 + 200) + 4 * 200 + 8


def test_eight_bit_keeps_embeddings_at_32_bit_states_as_the_trainer_does():
    from pathlib import Path

    from gpuplan.modelinfo import model_facts, read_config
    from gpuplan.plan.estimate.memory.states import bnb_state_bytes, is_embedding

    facts = model_facts(read_config(Path(__file__).resolve().parents[2] / "specs/models/llama-3.1-8b.json"))
    emb = [(n, s) for n, s in facts.param_shapes if is_embedding(n)]
    assert [n for n, _ in emb] == ["model.embed_tokens.weight"]
    emb_numel = emb[0][1][0] * emb[0][1][1]
    only_emb = bnb_state_bytes(tuple(emb), 2, True)
    assert only_emb == 2 * 4 * emb_numel  # two fp32 states
