"""The LoRA adapter path's bytes: shape.ADAPTER_BYTES against a trace of peft's forward and backward, the dtypes the
path runs in (adapter_mode), and the term the step-time model prices from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo.count import model_facts
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time import shape as S
from gpuplan.plan.estimate.step_time.model import step_time

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
A100 = lookup("A100-80GB")
MISTRAL = model_facts(
    {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
    }
)
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def _wl(method="lora", dropout=0.0, amp="bf16", weight="bfloat16", engine="none", **kw) -> Workload:
    return Workload(
        per_device_batch=4,
        seq_len=4096,
        weight_dtype=weight,
        amp=amp,
        gradient_checkpointing=True,
        engine=engine,
        shard_world_size=2 if engine != "none" else 1,
        zero_stage=3 if engine != "none" else 0,
        adapters=Adapters(method, 16, QKVO, lora_dropout=dropout),
        **kw,
    )


def test_the_modelled_bytes_are_the_traced_bytes_of_every_path():
    """benchmarks/adapter_traffic.py traces peft's Linear forward and backward in each mode, with and without dropout;
    the table the model prices must be within half a byte per element of it (the r-sized intermediates)."""
    sys.path.insert(0, str(BENCH))
    try:
        import adapter_traffic
    finally:
        sys.path.remove(str(BENCH))
    data = adapter_traffic.measure(tokens=1024)
    assert set(data["coefficients"]) == {f"{m}{d}" for m in S.ADAPTER_BYTES for d in ("", ", dropout")}
    assert adapter_traffic.worst_difference(data) < 0.5, data["coefficients"]


def test_the_mode_follows_the_dtypes_the_adapters_run_in(monkeypatch):
    assert S.adapter_mode(_wl()) == "half-amp"  # gpuplan's bf16 LoRA: fp32 adapters under autocast
    assert S.adapter_mode(_wl(amp=None)) == "half"  # a bf16 model without autocast: the whole path in fp32
    assert S.adapter_mode(_wl("qlora")) == "amp"  # kbit preparation: fp32 residual stream under autocast
    assert S.adapter_mode(_wl(weight="float32", amp=None)) == "fp32"
    assert S.adapter_mode(_wl(engine="fsdp")) == "16-bit"  # FSDP's param_dtype gathers the adapters in bf16
    assert S.adapter_mode(_wl(engine="fsdp", amp=None)) == "half"  # no MixedPrecision: peft's fp32 adapters stay
    monkeypatch.setattr(S, "ADAPTER_UPCAST", False)  # peft < 0.12: adapters in the base's dtype
    assert S.adapter_mode(_wl(amp=None)) == "16-bit"
    assert S.adapter_mode(_wl("qlora")) == "amp"  # a uint8-stored 4-bit weight is no float dtype: fp32 adapters
    assert S.adapter_mode(_wl("qlora", engine="fsdp", amp=None)) == "16-bit"  # quant_storage bf16 under FSDP


def _adapter_term(wl: Workload) -> float:
    st = step_time(MISTRAL, wl, A100, compute_dtype="bf16", peak_tflops=312.0)
    return next(t.seconds for t in st.terms if t.name == "LoRA adapter path")


def test_the_step_prices_the_path_by_its_bytes():
    s = S.build_shape(MISTRAL, _wl(amp=None, dropout=0.1), A100, "bf16")
    fan_in, fan_out = 4 * 4096, 4096 + 1024 + 1024 + 4096  # q, k, v, o of Mistral-7B (8 KV heads)
    assert s.adapter_fwd_bytes == (10 + 9) * fan_in + 28 * fan_out
    assert s.adapter_bwd_bytes == (20 + 9) * fan_in + 28 * fan_out
    # checkpointing runs the forward twice: tokens x layers x (2 forward + backward) / bandwidth
    bw = A100.memory_bandwidth_gbps * 1e9 * K.HBM_FRACTION
    expected = 4 * 4096 * 32 * (2 * s.adapter_fwd_bytes + s.adapter_bwd_bytes) / bw
    assert _adapter_term(_wl(amp=None, dropout=0.1)) == pytest.approx(expected)
    # fp32 over a bf16 base moves more than the 16-bit path, dropout adds to it, full fine-tuning has no such term
    assert _adapter_term(_wl(amp=None, dropout=0.1)) > _adapter_term(_wl(amp=None)) > _adapter_term(_wl(engine="fsdp"))
    full = step_time(
        MISTRAL, Workload(per_device_batch=4, seq_len=4096, weight_dtype="bfloat16"), A100, compute_dtype="bf16", peak_tflops=312.0
    )
    assert "LoRA adapter path" not in [t.name for t in full.terms]


def test_published_rows_take_their_peft_and_precision():
    """fms-acceleration ran peft 0.13 (fp32 adapters) on a bf16 model without autocast, dropout 0.1; the older
    sources' peft made the adapters in the base's dtype."""
    sys.path.insert(0, str(BENCH))
    try:
        import published_rows as P
    finally:
        sys.path.remove(str(BENCH))
    runs, _ = P.usable_runs()
    fms = [r for r in runs if "fms-acceleration" in r.row["source"] and r.row["method"] == "lora"]
    qwen = [r for r in runs if "QwenLM/Qwen" in r.row["source"] and r.row["method"] == "lora"]
    assert fms and qwen
    assert all(P.peft_upcasts(r.row) and r.workload.amp is None and r.workload.adapters.lora_dropout == 0.1 for r in fms)
    assert not any(P.peft_upcasts(r.row) for r in qwen) and all(r.workload.adapters.lora_dropout == 0.05 for r in qwen)
    # predict plans each row with its own peft and puts the shipped rule back
    before = S.ADAPTER_UPCAST
    terms = {t["name"]: t["seconds"] for t in P.predict(fms[0])["step_time"]["terms"]}
    assert S.ADAPTER_UPCAST is before
    s = S.build_shape(fms[0].facts, fms[0].workload, fms[0].gpu, "bf16")
    assert S.adapter_mode(fms[0].workload) == "half" and terms["LoRA adapter path"] > 0 and s.adapter_fwd_bytes > 0
