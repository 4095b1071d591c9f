"""The bytes the data-parallel collectives move (plan/estimate/comm_volumes.py, their seconds comm_time.py), issue 30 item 12:
priced in what the collectives carry, and FSDP2 shard_grad_op's gather per micro-batch."""

from __future__ import annotations

import dataclasses

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo import model_facts, read_config
from gpuplan.plan.estimate.comm_time import communication, sharded_step_terms
from gpuplan.plan.estimate.memory.types import Workload
from tests.helpers.planning import MODELS

FACTS = model_facts(read_config(str(MODELS / "llama-3.1-8b.json")), "causal-lm", 2)
H100 = lookup("H100-80GB")
P = FACTS.n_params


def _comm(wl: Workload) -> dict:
    return communication(FACTS, wl, H100, count=8, nodes=1)


def _wl(engine: str, stage: int, weight_dtype: str = "float32", amp: str | None = "bf16") -> Workload:
    return Workload(
        2, 2048, weight_dtype=weight_dtype, amp=amp, engine=engine, zero_stage=stage, shard_world_size=8, gradient_accumulation_steps=4
    )


@pytest.mark.parametrize("engine,stage", [("fsdp", 3), ("fsdp", 2), ("deepspeed", 3), ("deepspeed", 2), ("deepspeed", 1)])
def test_an_fp32_master_copy_under_bf16_amp_moves_bf16(engine, stage):
    # accelerate's FSDP2 plugin: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16) over fp32 master
    # parameters (utils/dataclasses.py set_mixed_precision, utils/fsdp_utils.py fsdp2_prepare_model); a
    # DeepSpeed bf16 engine holds 16-bit parameters and gradients. The traffic is the bf16 model's, not twice it.
    master = _comm(_wl(engine, stage))
    bf16 = _comm(_wl(engine, stage, weight_dtype="bfloat16"))
    assert master["bytes_per_gpu_per_step"] == bf16["bytes_per_gpu_per_step"]
    pure_fp32 = _comm(_wl(engine, stage, amp=None))  # no AMP: fp32 on the wire
    assert pure_fp32["bytes_per_gpu_per_step"] == pytest.approx(2 * master["bytes_per_gpu_per_step"], rel=1e-9)


def test_ddp_reduces_the_fp32_gradients_of_an_fp32_model_under_amp():
    # DDP all-reduces each parameter's .grad, which autocast leaves in the parameter's dtype (fp32)
    ddp = dataclasses.replace(_wl("ddp", 0), shard_world_size=1)
    assert _comm(ddp)["bytes_per_gpu_per_step"] == int(2 * 7 / 8 * P * 4)


def test_fsdp_shard_grad_op_gathers_every_micro_batch():
    # FSDP2 with reshard_after_forward=False keeps a unit's parameters through its backward and reshards
    # after it (torch fsdp/_fully_shard/_fsdp_param_group.py post_backward, reshard_after_backward=True), so
    # the next micro-batch gathers again; gradients are reduce-scattered every micro-batch (sync_each_batch).
    wl = _wl("fsdp", 2)
    comm = _comm(wl)
    assert comm["bytes_per_gpu_per_step"] == int(2 * 7 / 8 * P * 2 * 4)  # (gather + reduce-scatter) x accum 4
    assert "per micro-batch" in comm["formula"] and "accum + 1" not in comm["formula"]
    # the same volume as the per-collective terms of plan/estimate/comm_time.py
    terms = sharded_step_terms(FACTS, wl, H100, count=8, nodes=1)
    seconds = terms["all_gather_s"] + terms["reduce_scatter_s"]
    assert seconds * comm["link_gbyte_per_s"] * 1e9 == pytest.approx(comm["bytes_per_gpu_per_step"], rel=1e-6)
    # DeepSpeed ZeRO-2 keeps its formula: reduce-scatter per micro-batch, one all-gather per step
    assert _comm(_wl("deepspeed", 2))["bytes_per_gpu_per_step"] == int(7 / 8 * P * 2 * 5)
