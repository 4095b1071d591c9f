"""A decoder layer's elementwise bytes: terms.EAGER_LLAMA_BYTES against a trace of eager transformers, the residual
stream's dtype (shape.layer_stream) and the kernels a run fuses (shape.LAYER_KERNELS, Liger)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo.count import model_facts
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.estimate.step_time import shape as S
from gpuplan.plan.estimate.step_time.model import step_time
from gpuplan.plan.estimate.step_time.terms import EAGER_LLAMA_BYTES, EAGER_LLAMA_FROZEN_BACKWARD
from tests.helpers.planning import MODELS

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
A100 = lookup("A100-80GB")
LLAMA = json.loads((Path(MODELS) / "llama-2-7b.json").read_text())


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow
def test_the_eager_table_is_the_traced_bytes_of_a_llama_layer():
    """benchmarks/layer_traffic.py's trace, at fewer tokens (the per-token slope does not depend on them)."""
    data = _bench("layer_traffic").measure((256, 512))
    for stream, ((fh, ff), (bh, bf)) in EAGER_LLAMA_BYTES.items():
        c = data["coefficients"][stream]
        assert c["forward_h"] == pytest.approx(fh, abs=1) and c["forward_f"] == pytest.approx(ff, abs=1), (stream, c)
        assert c["backward_h"] == pytest.approx(bh, abs=1) and c["backward_f"] == pytest.approx(bf, abs=1), (stream, c)
        z = data["frozen"][stream]
        assert (z["forward_h"], z["forward_f"]) == (c["forward_h"], c["forward_f"]), (stream, z)  # the same forward
        zh, zf = EAGER_LLAMA_FROZEN_BACKWARD[stream]
        assert z["backward_h"] == pytest.approx(zh, abs=1) and z["backward_f"] == pytest.approx(zf, abs=1), (stream, z)
        assert zh < bh  # no norm weight's gradient


def _wl(**kw) -> Workload:
    return Workload(**{"per_device_batch": 4, "seq_len": 2048, "weight_dtype": "bfloat16", "amp": "bf16", **kw})


def test_the_residual_stream_is_fp32_where_weights_or_kbit_preparation_make_it():
    assert S.layer_stream(_wl(), 2) == "bf16"
    assert S.layer_stream(_wl(weight_dtype="float32"), 2) == "amp"  # fp32 master weights under bf16 autocast
    assert S.layer_stream(_wl(adapters=Adapters("qlora", 16, ("q_proj",))), 2) == "amp"  # kbit preparation
    assert S.layer_stream(_wl(weight_dtype="float32", engine="fsdp", shard_world_size=2, zero_stage=3), 2) == "bf16"
    assert S.layer_stream(_wl(weight_dtype="float32", amp=None), 4) == "fp32"


def _elementwise(facts, wl: Workload) -> float:
    st = step_time(facts, wl, A100, compute_dtype="bf16", peak_tflops=312.0)
    return next(t.seconds for t in st.terms if t.name == "elementwise activations")


def test_eager_layers_move_the_traced_bytes_and_fused_ones_the_hand_count(monkeypatch):
    facts = model_facts(LLAMA)
    eager = _elementwise(facts, _wl())
    (fh, ff), (bh, bf) = EAGER_LLAMA_BYTES["bf16"]
    from gpuplan.plan.estimate.step_time import constants as K

    bw = A100.memory_bandwidth_gbps * 1e9 * K.HBM_FRACTION
    assert eager == pytest.approx(4 * 2048 * 32 * (fh * 4096 + ff * 11008 + bh * 4096 + bf * 11008) / bw)
    fused = _elementwise(facts, _wl(liger_kernel=True))  # Liger fuses RMSNorm, rotary and SwiGLU
    assert 3 < eager / fused < 5
    monkeypatch.setattr(S, "LAYER_KERNELS", "fused")
    assert _elementwise(facts, _wl()) == pytest.approx(fused)
    # an fp32 stream under autocast moves more than a bf16 one
    monkeypatch.setattr(S, "LAYER_KERNELS", "eager")
    assert _elementwise(facts, _wl(weight_dtype="float32")) > eager


def test_a_frozen_base_runs_the_frozen_backward():
    """A LoRA base's norms take no weight gradient: its layers are priced by the frozen trace's backward."""
    facts = model_facts(LLAMA)
    lora = _elementwise(facts, _wl(adapters=Adapters("lora", 16, ("q_proj", "v_proj"))))
    (fh, ff), _ = EAGER_LLAMA_BYTES["bf16"]
    bh, bf = EAGER_LLAMA_FROZEN_BACKWARD["bf16"]
    from gpuplan.plan.estimate.step_time import constants as K

    bw = A100.memory_bandwidth_gbps * 1e9 * K.HBM_FRACTION
    assert lora == pytest.approx(4 * 2048 * 32 * (fh * 4096 + ff * 11008 + bh * 4096 + bf * 11008) / bw)
    assert lora < _elementwise(facts, _wl())


def test_families_not_traced_keep_the_hand_count():
    gpt2 = model_facts({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024})
    assert S.build_shape(gpt2, _wl(), A100, "bf16").eager_stream is None
    assert _elementwise(gpt2, _wl()) == pytest.approx(_elementwise(gpt2, _wl(liger_kernel=True)))


def test_published_rows_take_the_kernels_their_runs_had():
    P = _bench("published_rows")
    runs, _ = P.usable_runs()
    kinds = {}
    for r in runs:
        kinds.setdefault(r.row["source"].split()[0], set()).add(P.layer_kernels(r.row))
    assert kinds["github.com/QwenLM/Qwen"] == {"fused"} and kinds["github.com/modelscope/ms-swift"] == {"fused"}
    assert kinds["github.com/AnswerDotAI/fsdp_qlora"] == {"eager"}
    assert kinds["github.com/foundation-model-stack/fms-acceleration"] == {"eager"}
    titan = [r for r in runs if "torchtitan" in r.row["source"]]
    assert {P.layer_kernels(r.row) for r in titan if r.row["compile"]} == {"fused"}
    assert {P.layer_kernels(r.row) for r in titan if not r.row["compile"]} == {"eager"}


def test_a_cpu_plan_keeps_the_hand_count():
    """A CPU keeps its small activations in its caches between ops, which its probed DRAM bandwidth does not price."""
    facts = model_facts(
        {**LLAMA, "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4}
    )
    cpu = lookup("cpu")
    wl = _wl(weight_dtype="float32", amp=None)

    def term(w):
        st = step_time(facts, w, cpu, compute_dtype="fp32", peak_tflops=0.2)
        return next(t for t in st.terms if t.name == "elementwise activations")

    assert "eager" not in term(wl).formula and term(wl).seconds == pytest.approx(
        term(_wl(weight_dtype="float32", amp=None, liger_kernel=True)).seconds
    )
