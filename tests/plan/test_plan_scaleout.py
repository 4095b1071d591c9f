"""Plans across GPUs and nodes: the strategy the ladder picks, its per-GPU memory, host RAM for offload."""

from __future__ import annotations

import json

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo import model_facts
from gpuplan.plan.build import plan_file
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.types import PlanError
from tests.helpers.planning import ENV, MODELS, SPECS, plan_text

GIB = 1024**3
ENV_DS = {**ENV, "packages": {**ENV["packages"], "deepspeed": "0.19.8"}}

SPEC_8B_8GPU = """
[model]
config = "@MODELS@/llama-3.1-8b.json"
dtype = "bfloat16"
[hardware]
gpu = "H100-80GB"
count = 8
{hw}
[data]
seq_len = 2048
[training]
effective_batch_size = 64
{training}
[distributed]
{dist}
"""


def _spec(hw="", training="", dist='strategy = "auto"'):
    return SPEC_8B_8GPU.format(hw=hw, training=training, dist=dist)


def _change(plan, key):
    return next(c for c in plan.changes if c.key == key)


@pytest.fixture(scope="module")
def plan70b():
    return plan_file(SPECS / "llama-70b-8xh100.toml", environment=ENV)


def test_70b_on_8_h100_is_fully_sharded_with_offload(plan70b):
    assert plan70b.model.n_params == 70_553_706_496
    assert plan70b.value("distributed.strategy") == "fsdp"
    assert plan70b.value("distributed.fsdp_sharding") == "full_shard"
    assert plan70b.value("distributed.fsdp_cpu_offload") is True
    reason = _change(plan70b, "distributed.strategy").reason
    assert "full_shard" in reason and "CPU offload" in reason and "host RAM" in reason
    mem = plan70b.memory
    assert mem.fits and mem.reserved_peak_bytes <= mem.usable_bytes
    # the states live on the host; on the GPU only gathered units (a few layers' bf16 parameters)
    assert mem.components["optimizer_states"] == 0 and mem.components["gradients"] == 0
    assert 0 < mem.components["weights"] < 0.05 * 2 * plan70b.model.n_params
    # the loss is chunked (cheaper than checkpointing alone at this batch): no [tokens, vocab] logits at the peak
    assert plan70b.value("training.loss_chunk_size") == 1024 and mem.components["logits_loss"] == 0
    assert plan70b.memory.workload.shard_world_size == 8


def test_70b_cannot_fit_sharded_without_offload():
    """Why the ladder reached offload: FULL_SHARD keeps 16P/N = 131 GiB of fp32 states per GPU."""
    facts = model_facts(json.loads((MODELS / "llama-3.1-70b.json").read_text()), "causal-lm")
    gpu = lookup("H100-80GB", None)
    wl = Workload(
        1,
        4096,
        weight_dtype="bfloat16",
        amp="bf16",
        gradient_checkpointing=True,
        optim="adamw_torch_fused",
        engine="fsdp",
        zero_stage=3,
        shard_world_size=8,
    )
    est = estimate_memory(facts, wl, gpu)
    p = facts.n_params
    assert est.components["weights"] >= 4 * p // 8 and est.components["optimizer_states"] >= 8 * p // 8
    assert est.reserved_peak_bytes > gpu.memory_bytes


def test_70b_offload_checks_host_ram(tmp_path):
    text = (SPECS / "llama-70b-8xh100.toml").read_text().replace("host_memory_gib = 2048", "host_memory_gib = 256")
    text = text.replace('"models/', f'"{MODELS}/').replace('"data/', f'"{SPECS}/data/')
    # the fit search counts host RAM for offload candidates: the GPUs would hold full_shard + offload,
    # but every rank loads the whole bf16 model (8 x 131 GiB) into a 256 GiB host (plan/estimate/memory/host.py)
    with pytest.raises(PlanError, match="fits the GPU .* but its host RAM does not: it needs 1051 GiB of host RAM per node") as e:
        plan_text(tmp_path, text)
    errors = [d for d in e.value.diagnostics if d.severity == "error"]
    assert [d.key for d in errors] == ["hardware.gpu"]
    assert "230 GiB usable (hardware.host_memory_gib)" in errors[0].detail
    assert "qlora needs" in errors[0].detail  # the sharded QLoRA that fits, with its host RAM


def test_8b_on_8_h100_takes_shard_grad_op(tmp_path):
    plan = plan_text(tmp_path, _spec())
    assert plan.value("distributed.strategy") == "fsdp"
    assert plan.value("distributed.fsdp_sharding") == "shard_grad_op"
    assert "shard_grad_op" in _change(plan, "distributed.strategy").reason
    assert plan.memory.fits and plan.memory.reserved_peak_bytes <= plan.memory.usable_bytes
    # DDP, first on the ladder, does not fit: bf16 weights + grads + DDP's bucket copy + AdamW = 75 GiB
    facts = model_facts(json.loads((MODELS / "llama-3.1-8b.json").read_text()), "causal-lm")
    gpu = lookup("H100-80GB", None)
    ddp = estimate_memory(facts, Workload(1, 2048, weight_dtype="bfloat16", amp="bf16", optim="adamw_torch_fused", engine="ddp"), gpu)
    assert ddp.reserved_peak_bytes > plan.memory.usable_bytes


def test_8b_ddp_when_asked_needs_savers(tmp_path):
    """DDP replicates the states: only the 8-bit optimizer (and checkpointing) make it fit."""
    plan = plan_text(tmp_path, _spec(dist='strategy = "ddp"'))
    assert plan.value("distributed.strategy") == "ddp"
    assert [s.name for s in plan.memory.savers] == ["8-bit optimizer", "chunked cross-entropy", "gradient checkpointing"]
    c = plan.memory.components
    assert c["weights"] == 2 * 8_030_261_248
    # DDP's bucket copy of the gradients beside the gradients themselves (at batch 8, with the loss
    # chunked, the peak is inside the first layer's backward: all but its own and the embedding's)
    assert 2 * 8_030_261_248 < c["gradients"] <= 2 * 2 * 8_030_261_248


def test_two_nodes_shard_over_16_and_cross_the_network(tmp_path):
    one = plan_text(tmp_path, _spec())
    two = plan_text(tmp_path, _spec(hw="nodes = 2", training="").replace("effective_batch_size = 64", "effective_batch_size = 128"))
    assert two.memory.workload.shard_world_size == 16
    assert one.memory.workload.shard_world_size == 8
    # Adam states halve (8P/N fp32, plus a step scalar per tensor)
    p, tensors = 8_030_261_248, 291
    assert one.memory.components["optimizer_states"] == 8 * p // 8 + 4 * tensors
    assert two.memory.components["optimizer_states"] == 8 * p // 16 + 4 * tensors
    assert one.throughput.communication["link"] == "NVLink"
    assert two.throughput.communication["link"] == "InfiniBand-NDR"


def test_hybrid_shard_is_refused_because_apply_runs_fsdp2(tmp_path):
    # transformers 5.24 offers HYBRID_SHARD only through deprecated FSDP1 (issue 11 item 3)
    with pytest.raises(PlanError, match="hybrid_shard"):
        plan_text(
            tmp_path,
            _spec(hw="nodes = 2", dist='strategy = "fsdp"\nfsdp_sharding = "hybrid_shard"').replace(
                "effective_batch_size = 64", "effective_batch_size = 128"
            ),
        )


def test_deepspeed_takes_the_lowest_stage_that_fits(tmp_path):
    plan = plan_text(tmp_path, _spec(dist='strategy = "deepspeed"'), env=ENV_DS)
    assert plan.value("distributed.strategy") == "deepspeed"
    stage = plan.value("distributed.zero_stage")
    assert "the lowest ZeRO stage that fits" in _change(plan, "distributed.zero_stage").reason
    assert plan.memory.fits
    # ZeRO-1 keeps 2P bf16 weights + fp32 master and Adam (12P/N) + the step scalars
    if stage == 1:
        assert plan.memory.components["optimizer_states"] == 12 * 8_030_261_248 // 8 + 8


def test_example_specs_plan_and_fit():
    for name in ("llama-70b-8xh100.toml", "llama-8b-2nodes.toml"):
        plan = plan_file(SPECS / name, environment=ENV)
        assert plan.memory.fits, name
        assert plan.value("distributed.strategy") == "fsdp", name
