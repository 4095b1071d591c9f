"""Throughput estimate: FLOPs per step, and the step time from the step-time model (or a given utilisation)."""

from __future__ import annotations

import json

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.flops import flops_per_token, matmul_params
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.throughput import estimate_throughput

# Llama-3.1-8B (config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, head_dim
# 128, intermediate 14336, vocab 128256, untied). Parameters by hand:
#   per layer: q 4096*4096 + k,v 2*4096*1024 + o 4096*4096 = 41_943_040
#              MLP 3*4096*14336 = 176_160_768; two RMSNorms 8192 -> 218_112_000
#   32 layers 6_979_584_000 + final norm 4096 + embed and lm_head 2*128256*4096
#   = 8_030_261_248
EMBED = 128256 * 4096  # 525_336_576
LLAMA_8B = ModelFacts(
    model_type="llama",
    task="causal-lm",
    n_params=8_030_261_248,
    param_shapes=(),
    hidden_size=4096,
    num_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=131072,
    mlp="gated",
    norm="rmsnorm",
    tie_word_embeddings=False,
)
A100 = lookup("A100-80GB")
BF16_RUN = Workload(per_device_batch=1, seq_len=2048, gradient_accumulation_steps=16, amp="bf16")

# By hand: N = 8_030_261_248 - 525_336_576 = 7_504_924_672 (the input embedding is a lookup)
# 6N = 45_029_548_032; 12*L*H*Q*T = 12*32*32*128*2048 = 3_221_225_472
# per token 48_250_773_504; tokens per step 1*2048*16 = 32_768
# per step 48_250_773_504 * 32_768 = 1_581_081_346_179_072
# step time = 1.581081346179072e15 / (312e12 * 0.4) = 12.66892... s
TOKENS = 32_768
PER_TOKEN = 48_250_773_504
STEP_FLOPS = 1_581_081_346_179_072
STEP_TIME = 12.66892104310154


def test_llama_8b_on_a100_bf16():
    out = estimate_throughput(LLAMA_8B, BF16_RUN, A100, max_steps=1000, utilisation=0.4)
    assert out.tokens_per_step == TOKENS
    assert out.model_flops_per_token == out.flops_per_token == PER_TOKEN
    assert out.flops_per_step == out.model_flops_per_step == STEP_FLOPS
    assert (out.peak_dtype, out.peak_tflops, out.utilisation) == ("bf16", 312.0, 0.4)
    assert out.assumption == "40% of peak dense bf16 TFLOP/s (given)"
    assert out.step_time_s == pytest.approx(STEP_TIME, rel=1e-12)
    assert out.tokens_per_second == pytest.approx(2586.49, abs=0.01)  # 312e12 * 0.4 / 48_250_773_504
    assert out.run_time_s == pytest.approx(12668.92, abs=0.01)
    assert out.slowdowns == {} and out.notes == ()
    json.dumps(out.to_dict())  # the typed section serialises to JSON


def test_gradient_checkpointing_adds_recomputed_forward():
    # 8 * (N - head) + 6 * head + 16*L*H*Q*T, head = lm_head = 525_336_576:
    # 8*6_979_588_096 + 6*525_336_576 + 16*32*32*128*2048 = 63_283_691_520
    run = Workload(per_device_batch=1, seq_len=2048, gradient_accumulation_steps=16, amp="bf16", gradient_checkpointing=True)
    out = estimate_throughput(LLAMA_8B, run, A100, max_steps=None, utilisation=0.4)
    assert out.model_flops_per_token == PER_TOKEN
    assert out.flops_per_token == 63_283_691_520
    assert out.step_time_s == pytest.approx(63_283_691_520 * TOKENS / (312e12 * 0.4))
    assert out.run_time_s is None and out.max_steps is None
    assert "Korthikanti" in out.flops_formula


def test_empty_cache_costs_ten_percent():
    run = Workload(per_device_batch=1, seq_len=2048, gradient_accumulation_steps=16, amp="bf16", torch_empty_cache_steps=4)
    out = estimate_throughput(LLAMA_8B, run, A100, max_steps=10, utilisation=0.4)
    assert out.slowdowns == {"torch_empty_cache_steps": 0.10}
    assert out.step_time_s == pytest.approx(STEP_TIME * 1.1)
    assert out.flops_per_step == STEP_FLOPS


def test_data_parallel_ranks_multiply_tokens_not_step_time():
    out = estimate_throughput(LLAMA_8B, BF16_RUN, A100, max_steps=1, world_size=8, utilisation=0.4)
    assert out.tokens_per_step == 8 * TOKENS
    assert out.step_time_s == pytest.approx(STEP_TIME)
    assert out.tokens_per_second == pytest.approx(8 * TOKENS / STEP_TIME)
    # compute only: plan/build.py with_communication adds the communication (and says so)
    assert not any("not included" in n for n in out.notes)


@pytest.mark.parametrize(
    "gpu, workload_kw, tf32, dtype, peak",
    [
        ("A100-80GB", {}, False, "fp32", 19.5),
        ("A100-80GB", {}, True, "tf32", 156.0),
        ("A100-80GB", {"amp": "fp16"}, False, "fp16", 312.0),
        ("A100-80GB", {"weight_dtype": "bfloat16"}, False, "bf16", 312.0),
        ("H100-80GB", {"amp": "bf16"}, True, "bf16", 989.5),
        ("V100-16GB", {}, True, "fp32", 15.7),  # no tf32 before Ampere
        ("T4", {"amp": "fp16"}, False, "fp16", 65.0),
    ],
)
def test_peak_dtype(gpu, workload_kw, tf32, dtype, peak):
    run = Workload(per_device_batch=2, seq_len=512, **workload_kw)
    out = estimate_throughput(LLAMA_8B, run, lookup(gpu), max_steps=1, tf32=tf32, utilisation=0.4)
    assert (out.peak_dtype, out.peak_tflops) == (dtype, peak)
    assert out.step_time_s == pytest.approx(out.flops_per_step / (peak * 1e12 * 0.4))


def test_missing_dtype_falls_back_to_fp32_with_note():
    out = estimate_throughput(LLAMA_8B, BF16_RUN, lookup("V100-32GB"), max_steps=1)
    assert (out.peak_dtype, out.peak_tflops) == ("fp32", 15.7)
    assert out.notes == ("V100-32GB has no bf16 peak in the catalog; the fp32 peak is used",)


def test_cpu_is_priced_by_the_step_time_model_with_its_own_constants():
    run = Workload(per_device_batch=1, seq_len=128, device="cpu")
    out = estimate_throughput(LLAMA_8B, run, lookup("cpu"), max_steps=3)
    assert out.peak_dtype == "fp32" and out.step_time["arch_class"] == "cpu"
    assert out.assumption.startswith("step-time model, cpu constants")
    # one processor launches and computes: the step is the sum of its terms
    terms = out.step_time["terms"]
    assert out.step_time_s == pytest.approx(
        sum(t["seconds"] for t in terms if t["per"] == "step") + sum(t["seconds"] for t in terms if t["per"] == "micro-batch")
    )


def test_default_is_the_step_time_model_and_names_its_constants():
    out = estimate_throughput(LLAMA_8B, BF16_RUN, A100, max_steps=1)
    assert out.assumption.startswith("step-time model, ampere-dc constants (fitted: benchmarks/fit_step_time.py")
    st = out.step_time
    assert st["bound_by"] == "matmuls" and sum(st["shares"].values()) == pytest.approx(1.0)
    # the utilisation is what the model's step time implies
    assert out.utilisation == pytest.approx(STEP_FLOPS / (out.step_time_s * 312e12))
    assert 0.3 < out.utilisation < 0.9


def test_utilisation_override_and_validation():
    out = estimate_throughput(LLAMA_8B, BF16_RUN, A100, max_steps=1, utilisation=0.5)
    assert out.step_time_s == pytest.approx(STEP_TIME * 0.4 / 0.5)
    assert out.assumption == "50% of peak dense bf16 TFLOP/s (given)"
    with pytest.raises(ValueError, match="utilisation must be in"):
        estimate_throughput(LLAMA_8B, BF16_RUN, A100, max_steps=1, utilisation=1.5)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        estimate_throughput(LLAMA_8B, BF16_RUN, A100, max_steps=1, world_size=0)


def _small(task: str, tied: bool) -> ModelFacts:
    return ModelFacts(
        model_type="gpt2",
        task=task,
        n_params=1_000_000,
        param_shapes=(),
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=256,
        vocab_size=1000,
        max_position_embeddings=1024,
        mlp="plain",
        norm="layernorm",
        tie_word_embeddings=tied,
    )


@pytest.mark.parametrize(
    "task, tied, expected",
    [
        ("causal-lm", True, (1_000_000, 64_000)),  # the tied matrix does the lm_head matmul
        ("causal-lm", False, (936_000, 64_000)),
        ("masked-lm", True, (1_000_000, 64_000)),
        ("seq-cls", True, (936_000, 0)),  # no output head over the vocabulary
    ],
)
def test_matmul_params(task, tied, expected):
    assert matmul_params(_small(task, tied)) == expected


def test_flops_per_token_small_model_by_hand():
    # 6 * 1_000_000 + 12 * 2 * 4 * 16 * 128 = 6_000_000 + 196_608
    assert flops_per_token(_small("causal-lm", True), 128, False) == (6_196_608, 6_196_608)
    # 8 * 936_000 + 6 * 64_000 + 16 * 2 * 4 * 16 * 128 = 7_488_000 + 384_000 + 262_144
    assert flops_per_token(_small("causal-lm", True), 128, True) == (6_196_608, 8_134_144)
