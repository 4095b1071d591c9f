"""Chunked cross-entropy in the plan (memory/loss_chunking.py, rules/loss_chunking.py): the
logits part the memory model counts per chunk against the fake-tensor trace of the chunked
loss, the fit search reaching for it before checkpointing, the reason and the saver line
naming what it saves, the no-fit fix, the refusal where it cannot run, compare's column and
the step-time term.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from gpuplan.modelinfo import model_facts
from gpuplan.plan.build import plan_file
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.loss_chunking import CHUNK_TOKENS, NAME
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.types import PlanError
from tests.helpers.planning import ENV, SPECS, plan_text, spec

GIB = 2**30
SMALL_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [{"weight_dtype": "bfloat16"}, {"amp": "bf16"}, {}], ids=["bf16", "amp", "fp32"])
def test_trace_of_the_chunked_loss_shrinks_the_logits_part_by_what_the_plan_says(mode):
    from gpuplan.trace import trace_memory

    facts = model_facts(SMALL_LLAMA, "causal-lm", 2)
    plain = Workload(per_device_batch=1, seq_len=2048, **mode)
    chunked = dataclasses.replace(plain, loss_chunk_size=512)
    traced = {c: trace_memory(SMALL_LLAMA, w).components["logits_loss"] for c, w in ((0, plain), (512, chunked))}
    planned = {c: estimate_memory(facts, w).components["logits_loss"] for c, w in ((0, plain), (512, chunked))}
    # 2,048 tokens in chunks of 512: a quarter of the [tokens, vocab] loss path at its peak
    assert planned[512] == pytest.approx(planned[0] / 4, rel=1e-3)
    assert traced[512] == pytest.approx(planned[512], rel=0.01)
    assert traced[0] - traced[512] == pytest.approx(planned[0] - planned[512], rel=0.03)
    peak = trace_memory(SMALL_LLAMA, chunked).allocated_peak_bytes
    assert estimate_memory(facts, chunked).allocated_peak_bytes == pytest.approx(peak, rel=0.05)


def test_8b_qlora_at_8192_tokens_fits_the_4090_with_the_loss_chunked():
    plan = plan_file(SPECS / "llama-8b-qlora-4090-8k.toml", environment=ENV)
    assert plan.memory.fits and plan.value("data.seq_len") == 8192
    assert plan.value("training.loss_chunk_size") == CHUNK_TOKENS
    reason = plan.settings["training.loss_chunk_size"].reason
    assert "[8,192 x 128,256] logits and their fp32 copies never exist at once" in reason and "saves" in reason
    savers = {s.name: s for s in plan.memory.savers}
    assert NAME in savers and savers[NAME].saved_bytes > 8 * GIB and "slower" in savers[NAME].cost
    assert plan.throughput.saver_seconds[NAME] > 0


def test_without_chunking_the_same_run_does_not_fit_and_the_error_names_the_saver(tmp_path):
    text = (
        (SPECS / "llama-8b-qlora-4090-8k.toml")
        .read_text()
        .replace("models/llama-3.1-8b.json", str(SPECS / "models" / "llama-3.1-8b.json"))
        .replace("warmup_ratio = 0.03", "warmup_ratio = 0.03\nloss_chunk_size = 0")
    )
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text)
    err = next(d for d in e.value.diagnostics if d.severity == "error")
    assert "does not fit" in err.summary
    assert 'training.loss_chunk_size = "auto"' in err.fix
    assert "training.use_liger_kernel = true" in err.fix  # also checked by solving again with it on


def test_the_no_fit_error_offers_activation_offloading_when_it_fits(tmp_path):
    text = (
        (SPECS / "llama-8b-qlora-4090-8k.toml")
        .read_text()
        .replace("models/llama-3.1-8b.json", str(SPECS / "models" / "llama-3.1-8b.json"))
        .replace("warmup_ratio = 0.03", "warmup_ratio = 0.03\ngradient_checkpointing = false")
    )
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text)
    fix = next(d for d in e.value.diagnostics if d.severity == "error").fix
    # the host RAM it would need is priced by the same model (memory/offload_activations.py)
    assert re.search(r"training\.activation_offloading = true \(\d+ GiB of host RAM per GPU, [\d.]+ s per step", fix), fix
    assert 'training.gradient_checkpointing = "auto"' in fix


def test_chunking_the_loss_comes_before_checkpointing_when_it_is_enough(tmp_path):
    # Llama 3.2 1B in bf16 with its 128k vocabulary: the 8,192 x 128,256 logits and their fp32
    # copies (12 GiB) dominate, so chunking them (a few %) fits where checkpointing (20%) was used
    plan = plan_text(
        tmp_path,
        spec(
            model="llama-3.2-1b",
            gpu="RTX-4090",
            data="seq_len = 4096",
            training="per_device_train_batch_size = 2\neffective_batch_size = 2",
            extra='dtype = "bfloat16"',
        ),
    )
    assert plan.value("training.loss_chunk_size") == CHUNK_TOKENS
    assert plan.value("training.gradient_checkpointing") is False
    assert [s.name for s in plan.memory.savers] == [NAME]


def test_a_run_that_fits_keeps_the_loss_whole_and_says_why(tmp_path):
    plan = plan_text(tmp_path, spec())
    assert plan.value("training.loss_chunk_size") == 0
    assert plan.settings["training.loss_chunk_size"].reason.startswith("off: the run fits without chunking the loss")
    assert not plan.throughput.saver_seconds


def test_a_chunk_size_the_model_cannot_take_is_refused_with_the_fix(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec(model="bert-base-uncased", training="loss_chunk_size = 512", extra='task = "masked-lm"'))
    err = next(d for d in e.value.diagnostics if d.key == "training.loss_chunk_size")
    assert "chunked cross-entropy is for causal-lm" in err.summary
    assert err.fix == "set training.loss_chunk_size = 0 (or remove it)"


def test_auto_on_a_family_gpuplan_has_not_checked_is_off_with_the_reason(tmp_path):
    plan = plan_text(tmp_path, spec(model="gemma-2-2b"))
    assert plan.value("training.loss_chunk_size") == 0
    assert "'gemma2'" in plan.settings["training.loss_chunk_size"].reason


def test_compare_shows_the_saver_in_its_savers_column():
    from gpuplan.cli.compare import render_compare
    from gpuplan.plan.compare import compare
    from gpuplan.spec.load import load_toml

    rows = compare(load_toml(SPECS / "llama-8b-qlora-4090-8k.toml"), gpus=["RTX-4090"], counts=[1], environment=ENV)
    assert rows[0]["fits"] and NAME in rows[0]["savers"]
    table = "\n".join(render_compare(rows, "llama-8b-qlora-4090-8k.toml", "cost"))
    assert "chunked-ce+ckpt" in table


@pytest.mark.slow
def test_plan_trace_runs_the_chunked_loss_the_plan_chose(tmp_path):
    from gpuplan.trace.plan import trace_plan

    plan = plan_text(
        tmp_path,
        spec(
            model="llama-160m",
            gpu="T4",
            data="seq_len = 2048",
            training="per_device_train_batch_size = 1\neffective_batch_size = 1\nloss_chunk_size = 256\ngradient_checkpointing = true",
        ),
    )
    assert plan.memory.workload.loss_chunk_size == 256
    traced = trace_plan(plan).memory.traced
    # one 256-token chunk of 32,000 logits and its fp32 copies at most, not 2,048 tokens' worth
    assert traced["components"]["logits_loss"] <= 256 * 32000 * 16
    assert abs(traced["analytic_minus_traced_fraction"]) < 0.05
