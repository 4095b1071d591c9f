"""Model states per GPU under DDP, FSDP2 and DeepSpeed ZeRO, checked against the ZeRO formulas by hand.

ZeRO (Rajbhandari et al. 2020), mixed precision with Adam, P parameters, N ranks:
stage 1 = 2P + 2P + 12P/N, stage 2 = 2P + 14P/N, stage 3 = 16P/N. The extras the engines
add are asserted separately (memory/sharding.py documents each one).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuplan.modelinfo import model_facts
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.layout import model_layout
from gpuplan.plan.estimate.memory.sharding import DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET, sharded_states
from gpuplan.plan.estimate.memory.types import Workload

MODELS = Path(__file__).resolve().parents[2] / "specs" / "models"
N = 8
P8B, P70B = 8_030_261_248, 70_553_706_496


def _facts(name):
    return model_facts(json.loads((MODELS / f"{name}.json").read_text()), "causal-lm")


@pytest.fixture(scope="module", params=["llama-3.1-8b", "llama-3.1-70b"])
def facts(request):
    return _facts(request.param)


def _wl(engine, stage, n=N, **kw):
    base = dict(weight_dtype="bfloat16", amp="bf16", optim="adamw_torch_fused")
    return Workload(1, 16, engine=engine, zero_stage=stage, shard_world_size=n, **{**base, **kw})


def _states(facts, wl):
    return sharded_states(facts, wl, model_layout(facts), "adamw_fused")


def test_parameter_counts_are_the_hand_numbers():
    assert _facts("llama-3.1-8b").n_params == P8B
    assert _facts("llama-3.1-70b").n_params == P70B


def test_llama_shapes_split_evenly_over_8(facts):
    # every dim 0 (vocab 128256, hidden, kv and MLP widths) divides by 8: FSDP2 shards are exact
    assert all(shape[0] % N == 0 for _, shape in facts.param_shapes)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_states_are_zero_plus_the_fp32_gradient_partition(facts, stage):
    p, n_tensors = facts.n_params, 2  # DeepSpeed flattens each param group (decay / no decay)
    st = _states(facts, _wl("deepspeed", stage))
    paper = {1: 2 * p + 2 * p + 12 * p // N, 2: 2 * p + 14 * p // N, 3: 16 * p // N}[stage]
    fp32_grads = 4 * p // N  # single_partition_of_fp32_groups[i].grad (DeepSpeed's "4_grads_32bit")
    step_scalars = 4 * n_tensors  # Adam's step tensor per flat group
    persistent = 0
    if stage == 3:  # params under stage3_param_persistence_threshold stay gathered in 16 bits
        persistent = 2 * sum(s[0] for _, s in facts.param_shapes if len(s) == 1)  # the norm weights
        fp32_grads = 2 * p // N  # stage 3 reduces into fp32 partitions directly: no 16-bit grad partition
    total = st.weights + st.grads_step + st.optimizer_states
    assert total == paper + fp32_grads + step_scalars + persistent
    assert st.optimizer_states == 12 * p // N + step_scalars  # fp32 master + exp_avg + exp_avg_sq
    if stage == 2:  # DeepSpeed's own estimator: 2P + 18P/N (estimate_zero2_model_states_mem_needs)
        assert total - step_scalars == 2 * p + 18 * p // N
    if stage == 3:  # estimate_zero3_model_states_mem_needs: 18P/N (+ largest layer, below)
        assert total - step_scalars - persistent == 18 * p // N


def test_deepspeed_extras_buckets_and_gathered_layers(facts):
    s2, s3 = _states(facts, _wl("deepspeed", 2)), _states(facts, _wl("deepspeed", 3))
    assert s2.buckets == 2 * DS_REDUCE_BUCKET  # one bf16 ipg buffer (overlap_comm off below stage 3)
    assert s3.buckets == 2 * 2 * DS_REDUCE_BUCKET  # double-buffered (overlap_comm on at stage 3)
    head = facts.vocab_size * facts.hidden_size
    layer = (facts.n_params - 2 * head - facts.hidden_size) // facts.num_layers
    # DeepSpeed's "4 x largest layer" (params + grads in 16 bits); the LM head is the largest module
    assert s3.gathered_head == 4 * head + 2 * DS_PREFETCH_BUCKET
    assert s3.gathered_last_layer == 4 * layer + 2 * DS_PREFETCH_BUCKET
    assert s2.gathered_head == s2.gathered_forward == 0


@pytest.mark.parametrize("stage", [2, 3])
def test_fsdp_sharded_states_are_fp32_after_accelerates_upcast(facts, stage):
    p = facts.n_params
    st = _states(facts, _wl("fsdp", stage))
    # sharded fp32 params + fp32 grads + fp32 Adam = 16P/N (ZeRO-3's total, whatever model.dtype)
    assert st.weights == 4 * p // N
    assert st.grads_step == 4 * p // N
    assert st.optimizer_states == 8 * p // N + 4 * len(facts.param_shapes)  # + a step scalar per tensor
    assert st.buckets == 0


def test_fsdp_gathered_units(facts):
    p, head = facts.n_params, facts.vocab_size * facts.hidden_size
    layer = (p - 2 * head - facts.hidden_size) // facts.num_layers
    tail = head + facts.hidden_size  # [final norm, lm_head], reshard_after_forward=False
    full = _states(facts, _wl("fsdp", 3))
    assert full.gathered_forward == 2 * tail
    assert full.gathered_last_layer == 2 * 4 * layer  # 2 layers' params + 2 layers' grads, bf16
    sgo = _states(facts, _wl("fsdp", 2))
    # SHARD_GRAD_OP: all units stay gathered after forward: ZeRO-2's 2P of 16-bit params
    assert sgo.gathered_forward == 2 * p


def test_fsdp_without_amp_keeps_the_model_dtype(facts):
    st = _states(facts, _wl("fsdp", 3, amp=None))  # pure bf16: no upcast, no MixedPrecisionPolicy
    assert st.weights == 2 * facts.n_params // N
    assert st.optimizer_states == 4 * facts.n_params // N + 4 * len(facts.param_shapes)


def test_ddp_counts_the_bucket_copy_of_the_gradients(facts):
    none = estimate_memory(facts, _wl("none", 0, n=1))
    ddp = estimate_memory(facts, _wl("ddp", 0, n=1))
    # gradient_as_bucket_view=False: the reducer's buckets are a second gradient copy
    assert ddp.components["gradients"] - none.components["gradients"] == 2 * facts.n_params
    assert ddp.components["optimizer_states"] == none.components["optimizer_states"]


def test_offload_moves_states_to_host(facts):
    p = facts.n_params
    on_gpu = _states(facts, _wl("fsdp", 3))
    off = _states(facts, _wl("fsdp", 3, offload_params=True, offload_optimizer=True))
    assert off.host_bytes == on_gpu.weights + on_gpu.grads_step + on_gpu.optimizer_states
    assert off.weights == off.grads_step == off.optimizer_states == 0
    est = estimate_memory(facts, _wl("fsdp", 3, offload_params=True, offload_optimizer=True))
    assert est.host_bytes == off.host_bytes
    assert est.components["optimizer_states"] == 0
    ds = _states(facts, _wl("deepspeed", 2, offload_optimizer=True))
    assert ds.host_bytes == 12 * p // N + 4 * 2 + 4 * p // N  # master + Adam + fp32 grads (ZeRO-Offload)
    assert ds.optimizer_states == 0 and ds.weights == 2 * p


def test_estimate_uses_the_sharded_states(facts):
    wl = _wl("deepspeed", 2)
    est, st = estimate_memory(facts, wl), _states(facts, wl)
    assert est.components["optimizer_states"] == st.optimizer_states
    assert est.components["weights"] == st.weights  # stage 2 gathers nothing
    assert est.reserved_peak_bytes < estimate_memory(facts, _wl("none", 0, n=1)).reserved_peak_bytes


def test_activations_do_not_depend_on_the_number_of_ranks():
    facts = _facts("llama-3.1-8b")
    a8 = estimate_memory(facts, Workload(2, 2048, amp="bf16", engine="fsdp", zero_stage=3, shard_world_size=8))
    a16 = estimate_memory(facts, Workload(2, 2048, amp="bf16", engine="fsdp", zero_stage=3, shard_world_size=16))
    assert a8.components["activations"] == a16.components["activations"]
    assert a8.components["logits_loss"] == a16.components["logits_loss"]
    assert a16.components["optimizer_states"] < a8.components["optimizer_states"]


def test_more_sharding_never_needs_more_memory(facts):
    def reserved(engine, stage):
        return estimate_memory(facts, _wl(engine, stage, n=1 if engine == "ddp" else N)).reserved_peak_bytes

    assert reserved("ddp", 0) > reserved("deepspeed", 1) > reserved("deepspeed", 2) > reserved("deepspeed", 3)
    assert reserved("fsdp", 2) > reserved("fsdp", 3)


def test_fast_enough_for_the_solver():
    facts = _facts("llama-3.1-70b")
    wl = Workload(4, 4096, amp="bf16", engine="fsdp", zero_stage=3, shard_world_size=8)
    estimate_memory(facts, wl)
    t0 = time.perf_counter()
    for _ in range(200):
        estimate_memory(facts, wl)
    assert time.perf_counter() - t0 < 1.0


def test_ddp_under_accelerate_defaults_keeps_buckets_apart_from_the_gradients():
    """The DDP bucket copy memory/sharding counts is real: with the kwargs the Trainer gives
    accelerate (gradient_as_bucket_view left at False), gradients are not bucket views."""
    import torch
    import torch.distributed as dist
    from accelerate.utils import DistributedDataParallelKwargs
    from torch.nn.parallel import DistributedDataParallel

    assert "gradient_as_bucket_view" not in DistributedDataParallelKwargs().to_kwargs()  # torch default: False

    def grad_storages(**kwargs) -> int:
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
        ddp = DistributedDataParallel(model, **kwargs)
        for _ in range(2):  # views appear after the first iteration (DDP docstring)
            ddp(torch.randn(4, 32)).sum().backward()
        return len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert grad_storages() == 4  # own storage per gradient; the bucket is a second buffer
        assert grad_storages(gradient_as_bucket_view=True) == 1  # all grads live in the one bucket
    finally:
        dist.destroy_process_group()
