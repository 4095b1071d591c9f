"""Per-step time terms of sharded training: all-gathers, reduce-scatters and CPU offload over the host link.

Named, additive seconds per optimizer step, so a step-time model can add each to its own
compute and memory terms (or overlap them): `sharded_step_terms(...)` returns
{term name: seconds}. Pure arithmetic over ModelFacts and Workload, no torch.

- Ring collectives (Patarasuk & Yuan 2009; NCCL's bus-bandwidth model, as plan/estimate/communication.py):
  an all-gather or a reduce-scatter moves (N-1)/N of the full buffer through each GPU's link.
- FSDP2 (torch fsdp/_fully_shard, what apply runs): each unit is all-gathered in its forward and,
  under FULL_SHARD (reshard_after_forward=True), again in its backward; the tail unit
  (reshard_after_forward=False, accelerate fsdp2_prepare_model) and SHARD_GRAD_OP units once per
  micro-batch. Gradients of trainable tensors are reduce-scattered every micro-batch (apply's
  sync_each_batch, plan/estimate/memory/sharding.py). Frozen tensors (a LoRA base) are gathered but have
  no gradient to reduce.
- DeepSpeed ZeRO-3: each module's partitions are all-gathered for its forward and its backward;
  the 16-bit gradients are reduce-scattered into the partitions (runtime/zero/stage3.py).
- CPU offload (FSDP2 CPUOffloadPolicy; DeepSpeed offload_optimizer / offload_param): before each
  all-gather a rank copies its shard host -> GPU, after each reduce-scatter its gradient shard
  GPU -> host (torch _fsdp_param.py, _fsdp_collectives.py: the sharded gradient is moved to the
  CPU), and the optimizer steps on the CPU: its traffic (fp32 value, gradient and two Adam
  states read, three written: 24 bytes per element) at CPU_OPTIMIZER_BYTES_PER_S.
Bandwidths: the GPU link of plan/estimate/communication.py; the host link is the GPU's PCIe figure in
the catalog (hardware/catalog.toml interconnect.pcie). Times assume no overlap (upper bounds).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.communication import bandwidth_gbps
from gpuplan.plan.estimate.memory.types import Workload

# Assumed CPU optimizer-step throughput in bytes of memory traffic per second: a fraction of one
# socket's DDR bandwidth (e.g. 8 channels of DDR4-3200 = 205 GB/s peak); torch's foreach AdamW on
# the CPU reaches far less than peak. An assumption, not a measurement: calibration replaces it.
CPU_OPTIMIZER_BYTES_PER_S = 20e9
ADAM_BYTES_PER_ELEMENT = 24  # fp32: param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written
TERMS = ("all_gather_s", "reduce_scatter_s", "host_to_device_s", "device_to_host_s", "cpu_optimizer_step_s")


def _volumes(facts: ModelFacts, wl: Workload) -> tuple[int, int, int, int]:
    """(bytes all-gathered per micro-batch, gradient bytes reduce-scattered per micro-batch,
    this rank's shard bytes copied to the GPU per micro-batch, trainable values on this rank)."""
    n = max(wl.shard_world_size, 1)
    cb = 2 if wl.amp is not None or wl.engine == "deepspeed" else {"float32": 4}.get(wl.weight_dtype, 2)
    if wl.adapters is not None:
        from gpuplan.plan.estimate.memory.adapters import adapter_layout
        from gpuplan.plan.estimate.memory.adapters_sharded import sharded_adapter_states
        from gpuplan.plan.estimate.memory.states import optimizer_kind

        lay = adapter_layout(facts, wl.adapters)
        sh = sharded_adapter_states(facts, wl, lay.adapter_params, lay.saved_params, lay.adapter_shapes, optimizer_kind(wl.optim)[0])
        trainable = lay.adapter_params + lay.saved_params
        # each all-gather first copies this rank's 1/N of what it gathers to the GPU (with offload)
        return sh.gathered_per_step, cb * trainable, sh.gathered_per_step // n, -(-trainable // n)
    p = facts.n_params
    gathers = 2 if wl.zero_stage >= 3 else (1 if wl.engine == "fsdp" else 0)
    return gathers * cb * p, cb * p, gathers * cb * p // n, -(-p // n)


def sharded_step_terms(
    facts: ModelFacts,
    wl: Workload,
    gpu: GPUProfile,
    *,
    count: int,
    nodes: int,
    interconnect: str = "auto",
    network: str = "auto",
    networks: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, float]:
    """Seconds per optimizer step of each term in TERMS (0.0 when it does not apply)."""
    out = dict.fromkeys(TERMS, 0.0)
    n = max(wl.shard_world_size, 1)
    if wl.engine not in ("fsdp", "deepspeed") or n == 1:
        return out
    accum = max(wl.gradient_accumulation_steps, 1)
    gathered, grads, shard, local_trainable = _volumes(facts, wl)
    ring = (n - 1) / n
    bw, _ = bandwidth_gbps(gpu, 1 if n <= count else nodes, interconnect, network, networks or {})
    if wl.engine == "fsdp" or wl.zero_stage == 3:
        out["all_gather_s"] = accum * ring * gathered / (bw * 1e9)
    out["reduce_scatter_s"] = accum * ring * grads / (bw * 1e9)
    if wl.offload_params or wl.offload_optimizer:
        host = gpu.interconnect.get("pcie", 16.0) * 1e9
        if wl.offload_params:
            out["host_to_device_s"] = accum * shard / host
        out["device_to_host_s"] = accum * grads / n / host
        out["cpu_optimizer_step_s"] = ADAM_BYTES_PER_ELEMENT * local_trainable / CPU_OPTIMIZER_BYTES_PER_S
    return out


def describe(terms: Mapping[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.3g} s" for k, v in terms.items() if v)
