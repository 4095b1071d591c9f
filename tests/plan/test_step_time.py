"""The step-time model's terms on cases computed by hand (plan/estimate/step_time)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo.count import model_facts
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.model import combine, step_time
from gpuplan.plan.estimate.step_time.shape import build_shape
from gpuplan.plan.estimate.step_time.terms import (
    SAVED_GRADIENTS,
    Term,
    fixed_terms,
    gemm_efficiency,
    matmul_terms,
    memory_terms,
    optimizer_terms,
)

A100 = lookup("A100-80GB")  # bf16 312 TFLOP/s, 2039 GB/s
PEAK, BW = 312e12, 2039e9 * 0.8  # HBM_FRACTION pinned to 0.8 below
C = K.ArchConstants("test", 0.8, 1e-5, "hand")
LLAMA_7B = model_facts(
    {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }
)


@pytest.fixture(autouse=True)
def _pinned(monkeypatch):
    """The hand computations below use these values, not whatever the fit last gave."""
    monkeypatch.setattr(K, "M_HALF_TOKENS", 64.0)
    monkeypatch.setattr(K, "HBM_FRACTION", 0.8)
    monkeypatch.setattr(K, "DEQUANT_BW_FRACTION", 0.15)


def shape(**changes):
    """A hand-made shape: 1e9 matmul parameters in the layers, no head, bf16 weights."""
    base = build_shape(LLAMA_7B, Workload(per_device_batch=1, seq_len=8, weight_dtype="bfloat16", amp="bf16"), A100, "bf16")
    return dataclasses.replace(base, **{"body_params": 10**9, "head_params": 0, "trainable_params": 10**9, **changes})


def test_a_small_batch_is_bound_by_reading_the_weights():
    s = shape(tokens=8, batch=1, seq_len=8)
    # eta(8) = 0.8 x 8 / (8 + 64) = 0.08889; FLOPs (2 + 4) x 8 x 1e9 = 4.8e10
    # compute 4.8e10 / (0.08889 x 312e12) = 1.7308 ms
    # weights: forward read 2e9 B + backward read 2e9 B + dW write 2e9 B = 6e9 B / 1631.2 GB/s = 3.6783 ms
    terms = {t.name: t.seconds for t in matmul_terms(s, C, PEAK, BW)}
    assert terms["matmuls"] == pytest.approx(4.8e10 / (0.8 * 8 / 72 * 312e12), rel=1e-9)
    assert terms["matmuls"] == pytest.approx(1.7308e-3, rel=1e-4)
    assert terms["weight reads beyond the matmuls"] == pytest.approx(6e9 / BW - terms["matmuls"], rel=1e-9)
    assert terms["weight reads beyond the matmuls"] == pytest.approx(1.9475e-3, rel=1e-3)


def test_a_large_batch_is_compute_bound():
    s = shape(tokens=16384, batch=4, seq_len=4096)
    # eta = 0.8 x 16384 / 16448 = 0.79689; 6 x 16384 x 1e9 = 9.8304e13 FLOPs -> 0.39542 s
    terms = {t.name: t.seconds for t in matmul_terms(s, C, PEAK, BW)}
    assert set(terms) == {"matmuls"}  # the 3.7 ms of weight reads hide under the matmuls
    assert terms["matmuls"] == pytest.approx(9.8304e13 / (0.8 * 16384 / 16448 * 312e12), rel=1e-9)
    assert terms["matmuls"] == pytest.approx(0.39542, rel=1e-4)


def test_qlora_dequantizes_every_4bit_weight_each_pass():
    s = shape(
        tokens=2048,
        batch=1,
        seq_len=2048,
        frozen_base=True,
        quantized_params=10**9,
        checkpointing=True,
        trainable_params=4 * 10**6,
        grad_bytes=4,
    )
    # 1e9 weights x (0.5 B read + 2 B write) x 3 passes (forward, recompute, backward) = 7.5e9 B
    # at 15% of 2039 GB/s = 305.85 GB/s -> 24.522 ms
    dq = next(t for t in memory_terms(s, BW) if t.name == "4-bit dequantization")
    assert dq.seconds == pytest.approx(7.5e9 / (2039e9 * 0.15), rel=1e-9)
    assert dq.seconds == pytest.approx(0.024522, rel=1e-4)
    assert not any(t.name == "4-bit dequantization" for t in memory_terms(dataclasses.replace(s, quantized_params=0), BW))


def test_qlora_costs_more_than_lora_on_the_same_model():
    def run(method):
        wl = Workload(
            per_device_batch=1,
            seq_len=2048,
            weight_dtype="bfloat16",
            amp="bf16",
            gradient_checkpointing=True,
            adapters=Adapters(method, 16, ("q_proj", "v_proj")),
        )
        return step_time(LLAMA_7B, wl, A100, compute_dtype="bf16", peak_tflops=312.0)

    lora, qlora = run("lora"), run("qlora")
    assert "4-bit dequantization" in [t.name for t in qlora.terms]
    assert "4-bit dequantization" not in [t.name for t in lora.terms]
    assert 1.1 < qlora.step_s / lora.step_s < 2.0  # published: about 1.4x (issue 21)


def test_the_optimizer_step_counts_the_trainable_parameters_only():
    full = shape()
    lora = shape(frozen_base=True, trainable_params=4 * 10**6, grad_bytes=4)
    # full, bf16 weights, AdamW: read + write params 2 x 2 B, read grads 2 B, read + write 2 fp32 moments 2 x 8 B
    #   = 22 B x 1e9 / 1631.2 GB/s = 13.487 ms
    # LoRA: fp32 adapters, 2 x 4 + 4 + 16 = 28 B x 4e6 = 1.12e8 B -> 68.66 us
    f = next(t for t in optimizer_terms(full, BW, 1, None) if t.name == "optimizer step")
    lo = next(t for t in optimizer_terms(lora, BW, 1, None) if t.name == "optimizer step")
    assert f.seconds == pytest.approx(22e9 / BW, rel=1e-9) and f.seconds == pytest.approx(0.013487, rel=1e-4)
    assert lo.seconds == pytest.approx(1.12e8 / BW, rel=1e-9) and lo.seconds == pytest.approx(68.66e-6, rel=1e-3)
    sharded = next(t for t in optimizer_terms(full, BW, 8, None) if t.name == "optimizer step")
    assert sharded.seconds == pytest.approx(f.seconds / 8)


def test_launches_overlap_device_work_and_shares_add_up():
    dev = Term("a", "matmuls", 1.0, "micro-batch", "device", "")
    host = Term("k", "fixed costs", 1.5, "micro-batch", "host", "")
    opt = Term("o", "optimizer", 0.2, "step", "serial", "")
    step, micro, exposed = combine([dev, host, opt], accumulation=2, on_cpu=False)
    assert micro == 1.5 and step == pytest.approx(3.2)  # max(1.0, 1.5) x 2 + 0.2
    assert exposed == pytest.approx({"a": 2.0, "k": 1.0, "o": 0.2})
    step_cpu, _, _ = combine([dev, host, opt], accumulation=2, on_cpu=True)
    assert step_cpu == pytest.approx(5.2)  # one processor: (1.0 + 1.5) x 2 + 0.2


def test_a_step_model_is_json_ready_with_its_shares():
    wl = Workload(per_device_batch=1, seq_len=256, gradient_accumulation_steps=8, weight_dtype="bfloat16", amp="bf16")
    st = step_time(LLAMA_7B, wl, A100, compute_dtype="bf16", peak_tflops=312.0)
    d = json.loads(json.dumps(st.to_dict()))
    assert sum(d["shares"].values()) == pytest.approx(1.0)
    assert d["bound_by"] in d["shares"] and d["terms"] and d["arch_class"] == "ampere-dc"
    extra = Term("a saver", "memory-bound", 0.5, "step", "serial", "the saver's formula")
    with_extra = step_time(LLAMA_7B, wl, A100, compute_dtype="bf16", peak_tflops=312.0, extra=[extra])
    assert with_extra.step_s == pytest.approx(st.step_s + 0.5)  # the hook: a named term anyone appends


def test_fsdp_cpu_offload_is_priced():
    base = dict(
        per_device_batch=1,
        seq_len=2048,
        weight_dtype="bfloat16",
        amp="bf16",
        engine="fsdp",
        zero_stage=3,
        shard_world_size=2,
        adapters=Adapters("qlora", 64, ("q_proj", "v_proj")),
    )
    gpu = lookup("RTX-3090")
    on = step_time(LLAMA_7B, Workload(**base, offload_params=True), gpu, compute_dtype="bf16", peak_tflops=71.0)
    off = step_time(LLAMA_7B, Workload(**base), gpu, compute_dtype="bf16", peak_tflops=71.0)
    assert on.step_s > off.step_s
    assert {"CPU offload copies"} <= {t.name for t in on.terms}


def test_offload_copies_follow_the_engines_unshards():
    """A shard is copied up before each gather: FSDP FULL_SHARD / ZeRO-3 gather a unit twice per micro-batch, and the
    recomputed forward of a checkpointed layer runs on the backward's gather (as the plan's all-gather bytes count);
    SHARD_GRAD_OP gathers once. The copies are pinned DMA at HOST_COPY_FRACTION of the catalog PCIe figure, not NCCL's
    host-staged PCIE_FRACTION."""
    gpu = lookup("RTX-3090")

    def copies(engine: str, checkpointing: bool, stage: int = 3):
        wl = Workload(
            per_device_batch=1,
            seq_len=2048,
            weight_dtype="bfloat16",
            amp="bf16",
            engine=engine,
            zero_stage=stage,
            shard_world_size=2,
            offload_params=True,
            gradient_checkpointing=checkpointing,
            adapters=Adapters("qlora", 64, ("q_proj", "v_proj")),
        )
        st = step_time(LLAMA_7B, wl, gpu, compute_dtype="bf16", peak_tflops=71.0)
        s = build_shape(LLAMA_7B, wl, gpu, "bf16")
        return next(t for t in st.terms if t.name == "CPU offload copies"), s

    fsdp, s = copies("fsdp", True)
    assert "x 2 gathers" in fsdp.formula and fsdp.seconds == pytest.approx(copies("fsdp", False)[0].seconds)
    assert "x 2 gathers" in copies("deepspeed", True)[0].formula
    assert "x 1 gather +" in copies("fsdp", True, stage=2)[0].formula
    moved = s.n_params * s.stored_weight_bytes / 2 * 2 + s.trainable_params * s.grad_bytes / 2
    assert fsdp.seconds == pytest.approx(moved / (K.HOST_COPY_FRACTION * 32e9)) and K.HOST_COPY_FRACTION == 0.75


def test_dominant_fixed_costs_name_a_batch_that_fits_and_amortises_them():
    import re

    from gpuplan.plan.build import plan_file
    from tests.helpers.planning import ENV, SPECS

    over = {"training": {"per_device_train_batch_size": 1}, "data": {"seq_len": 256}}
    plan = plan_file(SPECS / "a100-fp16.toml", environment=ENV, overrides=over)
    assert plan.throughput.step_time["bound_by"] == "fixed costs"
    note = next(d for d in plan.diagnostics if d.key == "training.per_device_train_batch_size" and d.severity == "note")
    assert "fixed costs" in note.summary and "1 x 256 tokens" in note.summary
    batch = int(re.match(r"training.per_device_train_batch_size = (\d+)", note.fix).group(1))
    fixed = plan_file(SPECS / "a100-fp16.toml", environment=ENV, overrides={**over, "training": {"per_device_train_batch_size": batch}})
    assert fixed.memory.fits and fixed.throughput.step_time["shares"]["fixed costs"] < 0.25  # the fix works
    assert not any(d.key == "training.per_device_train_batch_size" and d.severity == "note" for d in fixed.diagnostics)


def test_the_cpu_figures_are_measured_once_and_cached(tmp_path, monkeypatch):
    from gpuplan.hardware import cpu_probe
    from gpuplan.hardware.detect import cpu_profile

    path = tmp_path / "cpu-probe.json"
    monkeypatch.setenv(cpu_probe.PROBE_ENV, str(path))
    first = cpu_probe.cpu_figures(2)  # a real torch matmul and copy on this CPU
    assert first["fp32_tflops"] > 0 and first["gbyte_per_s"] > 0 and path.exists()

    def again(*_a, **_k):
        raise AssertionError("measured twice")

    monkeypatch.setattr(cpu_probe, "measure", again)
    assert cpu_probe.cpu_figures(2)["fp32_tflops"] == first["fp32_tflops"]  # from the cache
    from gpuplan.hardware.detect import _cpu_count

    if _cpu_count() == 2:  # the profile of this machine reads the same cache: the measured figures, not nominal
        profile, how = cpu_profile()
        assert profile.peak_tflops["fp32"] == round(first["fp32_tflops"], 4) and "measured" in how


# --- regimes the published rows do not cover (issue 31): from the datasheets and per-kernel costs ---


def _gpt2(hidden: int, layers: int, heads: int):
    """A GPT-2 config as openai-community/gpt2's config.json has it: dropout 0.1 everywhere, gelu_new, tied head."""
    return model_facts(
        {
            "model_type": "gpt2",
            "n_embd": hidden,
            "n_layer": layers,
            "n_head": heads,
            "vocab_size": 50257,
            "n_positions": 1024,
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "tie_word_embeddings": True,
        }
    )


GPT2_124M = _gpt2(768, 12, 12)
# Megatron-LM's single-GPU baseline (Shoeybi et al. 2019, sec. 5.1 and table 1): 1.2B parameters,
# hidden 1536, 40 layers, 16 heads, sequence 1024, batch 8 per GPU, fp16 mixed precision with
# activation checkpointing: "39 TeraFLOPs ... sustained ... 30% of the theoretical peak" of a V100.
MEGATRON_1_2B = _gpt2(1536, 40, 16)


def _plan(facts, gpu, **wl):
    from gpuplan.plan.estimate.throughput import estimate_throughput

    base = dict(per_device_batch=8, seq_len=1024, weight_dtype="float32", amp="bf16", optim="adamw_torch")
    return estimate_throughput(facts, Workload(**{**base, **wl}), lookup(gpu), max_steps=None)


def test_eager_attention_moves_every_score_through_scale_mask_fp32_softmax_cast_and_dropout():
    from gpuplan.plan.estimate.step_time.terms import eager_score_bytes

    # bf16 (a = 2 B): QK^T write 2, scale r/w 4, mask add r/w 4, fp32 softmax r 2 w 4, cast r 4 w 2,
    # dropout r/w 4 + 1-byte mask, PV read 2 = 29 forward; backward 4 + 5 + 6 + 12 + 4 + 2 = 33
    assert eager_score_bytes(2, True) == (29, 33)
    assert eager_score_bytes(2, False) == (24, 28)  # no dropout kernel on the probabilities
    assert eager_score_bytes(4, False) == (32, 32)  # fp32: no cast back
    s = build_shape(
        GPT2_124M, Workload(per_device_batch=8, seq_len=1024, weight_dtype="bfloat16", attn_implementation="eager"), A100, "bf16"
    )
    from gpuplan.plan.estimate.step_time.terms import attention_terms

    scores = next(t for t in attention_terms(s, C, PEAK, BW) if t.name == "attention scores (eager)")
    assert scores.seconds == pytest.approx(12 * 8 * 12 * 1024**2 * (29 + 33) / BW, rel=1e-9)


def test_eager_attention_and_gelu_new_launch_the_kernels_they_run():
    from gpuplan.plan.estimate.step_time.shape import kernels_per_micro_batch

    wl = Workload(per_device_batch=8, seq_len=1024, weight_dtype="bfloat16")
    sdpa = build_shape(GPT2_124M, wl, A100, "bf16")
    eager = build_shape(GPT2_124M, dataclasses.replace(wl, attn_implementation="eager"), A100, "bf16")
    # per layer forward: 44 profiled (SDPA) + 7 more for gelu_new's 8 kernels + 2 residual dropouts;
    # eager attention: 6 kernels for SDPA's 1, + dropout: 6 more; backward 1.95x; 26 x 2 for head and loss
    assert kernels_per_micro_batch(sdpa) == int(12 * (44 + 9) * 2.95 + 52)
    assert kernels_per_micro_batch(eager) == int(12 * (44 + 15) * 2.95 + 52)


def test_gpt2_small_on_a100_is_memory_bound_and_eager_is_slower():
    eager, sdpa = _plan(GPT2_124M, "A100-80GB", attn_implementation="eager"), _plan(GPT2_124M, "A100-80GB")
    for t in (eager, sdpa):
        shares = t.step_time["shares"]
        # a 124M model cannot keep an A100's tensor cores busy: its elementwise traffic outweighs its GEMMs, and the
        # whole step reaches under half the GEMMs' own fraction (MAMF 0.86) of the peak
        assert t.step_time["bound_by"] == "memory-bound" and shares["matmuls"] < 0.5
        assert t.flops_per_step / t.step_time_s / 1e12 < 0.4 * t.peak_tflops
    # eager moves the [b, 12, 1024, 1024] scores through HBM ~6 times each way: SDPA's kernel does not
    assert 1.2 < sdpa.tokens_per_second / eager.tokens_per_second < 1.8


def test_megatrons_v100_baseline_is_reproduced_from_the_datasheet():
    t = _plan(MEGATRON_1_2B, "V100-32GB", amp="fp16", gradient_checkpointing=True, attn_implementation="eager")
    assert t.peak_dtype == "fp16" and t.peak_tflops == 125.0  # Volta: fp16 tensor cores, no bf16, no TF32
    achieved = t.flops_per_step / t.step_time_s / 1e12  # hardware FLOPs (recompute counted), as Megatron counts
    assert 39 / 1.25 < achieved < 39 * 1.25


def test_fp32_without_tensor_cores_runs_at_the_fp32_peak_not_a_whole_step_fraction():
    fp32 = _plan(MEGATRON_1_2B, "V100-32GB", amp=None, gradient_checkpointing=True)
    fp16 = _plan(MEGATRON_1_2B, "V100-32GB", amp="fp16", gradient_checkpointing=True)
    assert fp32.peak_dtype == "fp32" and fp32.peak_tflops == 15.7  # NVIDIA V100 datasheet: 15.7 fp32, 125 tensor
    assert fp32.step_time["bound_by"] == "matmuls"
    eta = fp32.step_time["constants"]["matmul_efficiency"]
    assert eta == fp16.step_time["constants"]["matmul_efficiency"]  # the GEMM fraction, of each dtype's own peak
    assert 0.5 < eta < 0.86  # a large GEMM's fraction (MAMF A100 0.86), not Megatron's 0.30 for a whole step
    # so fp32 is ~8x slower in its matmuls only: the whole step a bit less than 8x
    assert 3 < fp32.step_time_s / fp16.step_time_s < 8
    # and a T4 (Turing, fp16 tensor cores, no bf16): bf16 weights plan on its fp16 peak's dtype rules
    t4 = _plan(GPT2_124M, "T4", amp="fp16")
    assert t4.peak_dtype == "fp16" and t4.peak_tflops == 65.0


def test_a_gemm_fills_the_gpu_by_its_output_tiles_not_its_rows_alone():
    # M_HALF pinned to 64 rows at the 4096-wide reference: eta = 0.8 x mN / (mN + 64 x 4096)
    assert gemm_efficiency(C, 64) == pytest.approx(0.4, rel=1e-12)
    assert gemm_efficiency(C, 64, 4096) == pytest.approx(0.4, rel=1e-12)
    # half the width needs twice the rows for the same output tiles
    assert gemm_efficiency(C, 128, 2048) == pytest.approx(0.4, rel=1e-12)
    assert gemm_efficiency(C, 64, 2048) == pytest.approx(0.8 * 64 * 2048 / (64 * 2048 + 64 * 4096), rel=1e-12)
    # the head writes m x vocab: a 32,000-wide GEMM is near its plateau at 64 rows
    assert gemm_efficiency(C, 64, 32000) == pytest.approx(0.8 * 32000 / (32000 + 4096), rel=1e-12)
    # a CPU's rate is its measured matmul's: no tiles over SMs, the width does not count
    assert gemm_efficiency(K.CPU, 64, 256) == gemm_efficiency(K.CPU, 64, 4096)


def test_a_narrow_models_matmuls_run_at_a_lower_fraction_of_the_peak():
    # the same FLOPs and tokens priced at the model's hidden size: 2048 wide runs slower than 4096 wide
    wide = shape(tokens=256, batch=1, seq_len=256)
    narrow = dataclasses.replace(wide, hidden=2048)
    t_wide = {t.name: t.seconds for t in matmul_terms(wide, C, PEAK, BW)}["matmuls"]
    t_narrow = {t.name: t.seconds for t in matmul_terms(narrow, C, PEAK, BW)}["matmuls"]
    assert t_narrow / t_wide == pytest.approx(gemm_efficiency(C, 256, 4096) / gemm_efficiency(C, 256, 2048), rel=1e-12)
    # eta(256, 4096) = 0.8 x 256 / (256 + 64) = 0.64; eta(256, 2048) = 0.8 x 128 / (128 + 64) = 0.5333: 1.2x the time
    assert t_narrow == pytest.approx(1.2 * t_wide, rel=1e-12)


def test_zero3_hooks_overlap_the_device_on_one_rank_and_add_when_sharded():
    s = shape(checkpointing=False)
    hooks = {n: next(t for t in fixed_terms(s, C, n, 3) if t.name == "ZeRO-3 parameter hooks") for n in (1, 4)}
    assert hooks[1].kind == "host" and hooks[4].kind == "serial"
    assert s.zero3_tensors == s.trainable_tensors == 9 * 32 + 3  # a full fine-tune: the model's own tensors
    assert hooks[1].seconds == hooks[4].seconds == pytest.approx(s.zero3_tensors * 2 * K.ZERO3_HOOK_S)
    dev = Term("d", "matmuls", 10 * hooks[1].seconds, "micro-batch", "device", "")
    one, _, _ = combine([dev, hooks[1]], accumulation=1, on_cpu=False)
    sharded, _, _ = combine([dev, hooks[4]], accumulation=1, on_cpu=False)
    assert one == pytest.approx(dev.seconds)  # hidden behind the device's work
    assert sharded == pytest.approx(dev.seconds + hooks[4].seconds)


def _lora_7b(engine: str, stage: int):
    adapters = Adapters(method="lora", r=64, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    wl = Workload(
        per_device_batch=1, seq_len=512, weight_dtype="bfloat16", amp="bf16", gradient_checkpointing=True,
        engine=engine, zero_stage=stage, shard_world_size=2 if engine != "none" else 1, adapters=adapters,
    )  # fmt: skip
    return wl, build_shape(LLAMA_7B, wl, A100, "bf16")


def test_zero3_hooks_count_loras_adapters_and_zero2_hooks_the_trainable_tensors():
    """DeepSpeed hooks every parameter under ZeRO-3 (LoRA's A and B too) and every trainable one's gradient under
    ZeRO-1/2 (benchmarks/zero_overhead.py measures one cost per tensor for full and LoRA only when counted so)."""
    wl, s = _lora_7b("deepspeed", 3)
    assert s.trainable_tensors == 2 * 7 * 32  # lora_A and lora_B of 7 linears a layer
    assert s.zero3_tensors == 9 * 32 + 3 + s.trainable_tensors  # 7 linears and 2 norms a layer, embedding, norm, head
    z3 = next(t for t in fixed_terms(s, C, 2, 3) if t.name == "ZeRO-3 parameter hooks")
    assert z3.seconds == pytest.approx(s.zero3_tensors * 3 * K.ZERO3_HOOK_S) and z3.kind == "serial"
    wl, s = _lora_7b("deepspeed", 2)
    hooks = [t for t in fixed_terms(s, C, 2, 2) if "hooks" in t.name]
    assert [(t.name, t.kind, t.per) for t in hooks] == [("ZeRO-2 gradient hooks", "host", "micro-batch")]
    assert hooks[0].seconds == pytest.approx(448 * K.ZERO2_HOOK_S)
    # the plan's step carries it; DDP and stage 1 (one reduce per step at the boundary, not priced) have no such term
    names = {t.name for t in step_time(LLAMA_7B, wl, A100, compute_dtype="bf16", peak_tflops=312.0).terms}
    assert "ZeRO-2 gradient hooks" in names
    for other in (_lora_7b("ddp", 0)[0], _lora_7b("deepspeed", 1)[0]):
        assert not any("hooks" in t.name for t in step_time(LLAMA_7B, other, A100, compute_dtype="bf16", peak_tflops=312.0).terms)


def test_dora_and_saved_modules_are_tensors_deepspeed_hooks_too():
    """DoRA's magnitude vectors and the saved modules' copies train beside A and B: ZeRO counts every one."""
    targets = ("q_proj", "v_proj")
    dora = Workload(
        per_device_batch=1, seq_len=64, weight_dtype="bfloat16", amp="bf16", engine="deepspeed", zero_stage=2, shard_world_size=2,
        adapters=Adapters(method="lora", r=8, target_modules=targets, use_dora=True),
    )  # fmt: skip
    s = build_shape(LLAMA_7B, dora, A100, "bf16")
    assert s.trainable_tensors == 3 * 2 * 32  # A, B and the magnitude of 2 linears a layer
    saved = dataclasses.replace(dora, adapters=Adapters(method="lora", r=8, target_modules=targets, modules_to_save=("lm_head",)))
    assert build_shape(LLAMA_7B, saved, A100, "bf16").trainable_tensors == 2 * 2 * 32 + 1


def test_the_fixed_zero_hook_costs_are_the_ones_the_benchmark_measured():
    """constants.ZERO2_HOOK_S is written by hand from benchmarks/data/zero_overhead.json: they must agree."""
    from tests.helpers.cli_runs import REPO

    measured = json.loads((REPO / "benchmarks" / "data" / "zero_overhead.json").read_text())
    assert K.ZERO2_HOOK_S == pytest.approx(measured["zero2_hook_s"], rel=0.01)


def test_a_saved_head_under_lora_runs_its_weight_gradient_gemm_and_accumulates_its_gradients():
    """modules_to_save trains the head in full beside the adapters (peft ModulesToSaveWrapper): its backward computes dW
    (2 x m x vocab x hidden FLOPs more) and AccumulateGrad reads and writes its gradient every micro-batch."""
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    plain = Adapters(method="lora", r=16, target_modules=targets)
    saved = dataclasses.replace(plain, modules_to_save=("embed_tokens", "lm_head"))
    wl = Workload(per_device_batch=1, seq_len=512, weight_dtype="bfloat16", amp="bf16", adapters=plain)
    a, b = build_shape(LLAMA_7B, wl, A100, "bf16"), build_shape(LLAMA_7B, dataclasses.replace(wl, adapters=saved), A100, "bf16")
    head = 32000 * 4096
    assert (a.saved_params, a.saved_linear_params) == (0, 0)
    assert (b.saved_params, b.saved_linear_params, b.saved_head_params) == (2 * head, head, head)  # the embedding: a lookup
    assert b.saved_grad_bytes == 2  # the copies keep the bf16 base's dtype (the adapters' gradients are fp32: grad_bytes 4)
    q = dataclasses.replace(saved, method="qlora")
    assert build_shape(LLAMA_7B, dataclasses.replace(wl, adapters=q), A100, "bf16").saved_grad_bytes == 4  # kbit: fp32
    assert b.trainable_params - a.trainable_params == 2 * head and b.trainable_tensors == a.trainable_tensors + 2

    def by_name(terms):
        return {t.name: t for t in terms}

    ma, mb = by_name(matmul_terms(a, C, PEAK, BW)), by_name(matmul_terms(b, C, PEAK, BW))
    # the dW GEMM writes vocab-wide rows: priced at the head's efficiency, eta(512, 32000), in a term of its own
    extra = 2 * 512 * head / (gemm_efficiency(C, 512, 32000) * PEAK)
    assert mb["matmuls"].seconds == ma["matmuls"].seconds and SAVED_GRADIENTS not in ma
    assert mb[SAVED_GRADIENTS].seconds == pytest.approx(extra, rel=1e-9) and mb[SAVED_GRADIENTS].group == "matmuls"
    acc_a, acc_b = by_name(memory_terms(a, BW)), by_name(memory_terms(b, BW))
    assert "gradient accumulation" not in acc_a  # adapters' gradients are too few to price
    assert acc_b["gradient accumulation"].seconds == pytest.approx(2 * head * 2 * 2 / BW, rel=1e-12)
    # a full fine-tune's terms are untouched by the new fields
    full = build_shape(LLAMA_7B, Workload(per_device_batch=1, seq_len=512, weight_dtype="bfloat16", amp="bf16"), A100, "bf16")
    assert (full.saved_params, full.saved_linear_params) == (0, 0)


def test_zero3_counts_the_models_own_tensors_not_llamas_nine_a_layer():
    """phi3 fuses qkv and gate/up: 6 tensors a layer, which DeepSpeed hooks; the count is the model's, not a floor."""
    phi3 = model_facts(
        {
            "model_type": "phi3",
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "intermediate_size": 512,
            "vocab_size": 1000,
            "tie_word_embeddings": False,
            "max_position_embeddings": 512,
        }
    )
    wl = Workload(per_device_batch=1, seq_len=64, weight_dtype="bfloat16", amp="bf16", engine="deepspeed", zero_stage=3)
    s = build_shape(phi3, wl, A100, "bf16")
    assert s.zero3_tensors == len(phi3.param_shapes) == 6 * 4 + 3


def test_checkpointing_prices_its_own_host_work_in_launches_worth_as_measured():
    """torch.utils.checkpoint's Python around the recomputed kernels (saved-tensor hooks, or the reentrant form's RNG state
    and nested backward) is host work per checkpointed layer: CHECKPOINT_HOST_KERNELS launches' worth, the figures
    benchmarks/host_overhead.py measured (benchmarks/data/host_overhead.json)."""
    from gpuplan.plan.estimate.step_time import shape as S
    from tests.helpers.cli_runs import REPO

    # the GPU host's measurement where there is one (benchmarks/device/run_checks.sh), as fit_step_time takes KERNEL_S's prior
    data = REPO / "benchmarks" / "data"
    source = next(p for p in (data / "host_overhead-cuda.json", data / "host_overhead.json") if p.exists())
    measured = json.loads(source.read_text())["checkpoint_host_kernels"]
    assert {mode: tuple(v) for mode, v in measured.items()} == S.CHECKPOINT_HOST_KERNELS
    assert S.CHECKPOINT_MODE == "non-reentrant"  # transformers 5 and gpuplan's apply (use_reentrant=False)
    wl, s = _lora_7b("none", 0)
    layer, adapter = S.CHECKPOINT_HOST_KERNELS["non-reentrant"]
    term = next(t for t in fixed_terms(s, C) if t.name == "checkpointing's host work")
    assert (term.kind, term.per, term.group) == ("host", "micro-batch", "fixed costs")
    assert term.seconds == pytest.approx(32 * (layer + 7 * adapter) * C.kernel_s, rel=1e-12)
    off = dataclasses.replace(s, checkpointing=False)
    assert not any(t.name == "checkpointing's host work" for t in fixed_terms(off, C))


def test_a_dpo_forward_without_gradients_leaves_the_saved_modules_weight_gradients_out():
    """DPO's reference forwards are 2/units of the policy's matmul time: the saved head's dW is backward-only work."""
    from gpuplan.plan.estimate.throughput import nograd_forward_terms
    from gpuplan.spec.objectives import objective

    targets = ("q_proj", "v_proj")
    wl = Workload(
        per_device_batch=1, seq_len=512, weight_dtype="bfloat16", amp="bf16", objective="dpo",
        adapters=Adapters(method="lora", r=16, target_modules=targets, modules_to_save=("lm_head",)),
    )  # fmt: skip
    s = build_shape(LLAMA_7B, wl, A100, "bf16")
    terms = matmul_terms(s, C, PEAK, BW)
    assert any(t.name == SAVED_GRADIENTS for t in terms)
    without = [t for t in terms if t.name != SAVED_GRADIENTS]
    dpo = objective("dpo")
    with_saved, _ = nograd_forward_terms(dpo, wl, terms)
    plain, _ = nograd_forward_terms(dpo, wl, without)
    assert with_saved is not None and with_saved.seconds == plain.seconds > 0


def test_a_saved_heads_weight_gradient_counts_in_the_steps_flops_and_its_mfu():
    """The plan's FLOPs per token (its MFU's numerator) carry the saved linears' dW: 2 FLOPs a weight a token."""
    from gpuplan.plan.estimate.throughput import estimate_throughput

    targets = ("q_proj", "v_proj")
    plain = Adapters(method="lora", r=16, target_modules=targets)
    wl = Workload(per_device_batch=2, seq_len=512, weight_dtype="bfloat16", amp="bf16", adapters=plain)
    a = estimate_throughput(LLAMA_7B, wl, A100, max_steps=None).to_dict()
    saved = dataclasses.replace(wl, adapters=dataclasses.replace(plain, modules_to_save=("lm_head",)))
    b = estimate_throughput(LLAMA_7B, saved, A100, max_steps=None).to_dict()
    assert b["model_flops_per_token"] - a["model_flops_per_token"] == 2 * 32000 * 4096
    assert b["flops_per_step"] - a["flops_per_step"] == pytest.approx(2 * 32000 * 4096 * 2 * 512, rel=1e-12)
    assert "2N_saved" in b["flops_formula"] and "2N_saved" not in a["flops_formula"]


def test_a_cpu_prices_the_trainer_step_at_its_measurement_and_a_gpu_at_the_published_fit():
    """The Trainer's per-step host work: a GPU class takes TRAINER_STEP_S, fitted on published GPU runs; a CPU takes
    benchmarks/host_overhead.py's measurement on a CPU (the GPU figure, 0.1 s, priced a 0.11M-parameter CPU run's step
    at 5x what it measured: benchmarks/time_accuracy.py)."""
    from pathlib import Path

    s = build_shape(LLAMA_7B, Workload(per_device_batch=1, seq_len=128), A100, "bf16")

    def trainer(c: K.ArchConstants) -> Term:
        return next(t for t in fixed_terms(s, c) if t.name == "Trainer and dataloader")

    gpu, cpu = trainer(K.constants_for(A100)), trainer(K.constants_for(lookup("cpu")))
    assert (gpu.seconds, gpu.source) == (K.TRAINER_STEP_S, K.FIT_SOURCE) and gpu.per == "step"
    assert cpu.seconds == K.CPU_TRAINER_STEP_S and "host_overhead.py" in cpu.source and cpu.per == "step"
    assert "3.2 ms per optimizer step" in cpu.formula
    # a whole CPU plan prices it so, and says so in --json's constants
    from gpuplan.plan.estimate.throughput import estimate_throughput

    out = estimate_throughput(LLAMA_7B, Workload(per_device_batch=1, seq_len=128, device="cpu"), lookup("cpu"), max_steps=3)
    assert out.step_time["constants"]["trainer_step_s"] == K.CPU_TRAINER_STEP_S
    assert next(t for t in out.step_time["terms"] if t["name"] == "Trainer and dataloader")["seconds"] == K.CPU_TRAINER_STEP_S
    measured = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "host_overhead.json").read_text())
    assert K.CPU_TRAINER_STEP_S == measured["trainer_step_s"]  # a re-measurement updates the constant with it


def test_a_class_with_one_published_row_keeps_its_prior_and_a_borrower_says_whose():
    """Ada has one published row: its GEMM fraction is the physical prior (0.8 of the bound), not a value fitted to
    that row; the consumer Blackwell cards that borrow Ada's take the same prior and name it."""
    ada = K.constants_for(lookup("RTX-4090"))
    assert "ada" not in K.ETA and ada.matmul_efficiency == K.ETA_PRIOR["ada"] == 0.8 * K.MAMF_DEFAULT[0]
    assert "physical prior" in ada.source and "one published row" in ada.source
    five = K.constants_for(lookup("RTX-5090"))
    assert K.arch_class(lookup("RTX-5090")) == "blackwell-consumer"
    assert five.matmul_efficiency == pytest.approx(ada.matmul_efficiency * 1.127) and "ada's used" in five.source
    a100 = K.constants_for(lookup("A100-80GB"))
    assert a100.matmul_efficiency == K.ETA["ampere-dc"] and "physical prior" not in a100.source


def test_a_lower_power_card_runs_its_classs_gemm_fraction_scaled_by_its_measured_maximum():
    """An L4 (72 W Ada) reached 0.586 of its datasheet in a GEMM sweep where the class is bounded at 1.0; an H100 PCIe
    0.656 where the H100 SXM's MAMF is 0.801: each prices its GEMMs at the class's fraction times its own maximum over
    the class's, says so, and a step of the same work takes longer for it."""
    l4, ada = lookup("L4"), lookup("RTX-4090")
    c4, ca = K.constants_for(l4), K.constants_for(ada)
    assert c4.matmul_efficiency == pytest.approx(ca.matmul_efficiency * 0.586 / K.MAMF_DEFAULT[0])
    assert "x 0.586 / 1: L4's fastest measured GEMM" in c4.source
    pcie, sxm = lookup("H100-PCIe"), lookup("H100-80GB")
    assert K.constants_for(pcie).matmul_efficiency == pytest.approx(K.ETA["hopper"] * 0.656 / K.MAMF["hopper"][0])
    assert K.constants_for(sxm).matmul_efficiency == K.ETA["hopper"]
    # a borrowing class scales against its lender's bound: the T4 (Turing) against the A100's MAMF
    assert K.constants_for(lookup("T4")).matmul_efficiency == pytest.approx(K.ETA["ampere-dc"] * 0.645 / K.MAMF["ampere-dc"][0])
    # fp32 on CUDA cores is not the tensor-core figure the sweep measured: unscaled
    assert K.constants_for(l4, "fp32").matmul_efficiency == ca.matmul_efficiency
    wl = Workload(per_device_batch=8, seq_len=2048, weight_dtype="bfloat16", amp="bf16")
    own = step_time(LLAMA_7B, wl, l4, compute_dtype="bf16", peak_tflops=121.0)
    classs = step_time(LLAMA_7B, wl, l4, compute_dtype="bf16", peak_tflops=121.0, constants=K._gpu_constants("ada"))
    mm = [t for t in own.terms if t.name == "matmuls"][0].seconds
    assert mm == pytest.approx([t for t in classs.terms if t.name == "matmuls"][0].seconds / 0.586, rel=1e-6)
    assert own.micro_batch_s > classs.micro_batch_s
