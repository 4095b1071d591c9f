"""Data-parallel communication per optimizer step: bytes each GPU sends and the time it takes.

Ring collectives (Patarasuk & Yuan 2009; NCCL's bus-bandwidth model): an all-reduce
moves 2(N-1)/N of the buffer per GPU, a reduce-scatter or an all-gather (N-1)/N.
Per step, P parameters of b bytes (Rajbhandari et al. 2020, ZeRO, section 7):
  DDP, ZeRO-1 : one all-reduce of the gradients per optimizer step (no_sync while
                accumulating)                                   2(N-1)/N * P*b
  ZeRO-2      : reduce-scatter of gradients every micro-batch, all-gather of the
                updated parameters per step          (N-1)/N * P*b * (accum + 1)
  ZeRO-3      : all-gather in forward and in backward and a reduce-scatter,
                every micro-batch                             3(N-1)/N * P*b * accum
  FSDP2 SHARD_GRAD_OP (reshard_after_forward=False): one all-gather per micro-batch (the unit
                keeps its parameters through its backward and reshards after it: torch
                fsdp/_fully_shard/_fsdp_param_group.py post_backward, reshard_after_backward
                defaults to True) and a reduce-scatter per micro-batch (apply's sync_each_batch),
                not ZeRO-2's one all-gather per step          2(N-1)/N * P*b * accum
Bytes b: what the collectives carry, not what is stored. Under bf16/fp16 AMP FSDP2 gathers and
reduces in the compute dtype (accelerate utils/dataclasses.py FullyShardedDataParallelPlugin
set_mixed_precision: MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype), applied by
utils/fsdp_utils.py fsdp2_prepare_model over fp32 master parameters), and DeepSpeed's bf16/fp16
engine holds 16-bit parameters and gradients: 2 bytes for an fp32 master copy too. DDP reduces
the parameters' own gradients (fp32 under AMP): the stored dtype.
HYBRID_SHARD: ZeRO-3 inside a node, plus an all-reduce of each GPU's gradient shard
across nodes. Bandwidth: NVLink (or PCIe) inside one node; across nodes the network,
assuming one NIC per GPU as on HGX/DGX nodes. The time here assumes no overlap with
compute; the step-time model (plan/estimate/step_time/links.py) overlaps it as it says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.methods import method_of

DEFAULT_NETWORK = "InfiniBand-NDR"


def bandwidth_gbps(
    gpu: GPUProfile, nodes: int, interconnect: str, network: str, networks: Mapping[str, Mapping[str, float]]
) -> tuple[float, str]:
    """(GB/s per GPU of the slowest link the collective crosses, its name)."""
    if nodes > 1:
        name = next((n for n in networks if n.lower() == network.lower()), DEFAULT_NETWORK) if network != "auto" else DEFAULT_NETWORK
        return networks[name]["gbyte_per_s"], name
    links = gpu.interconnect
    if interconnect == "pcie" or "nvlink" not in links:
        return links.get("pcie", 16.0), "PCIe"
    return links["nvlink"], "NVLink"


def collective_bytes(wl: Workload) -> int:
    """Bytes per element the full fine-tune's collectives move (module docstring: "Bytes b")."""
    if wl.engine in ("fsdp", "deepspeed") and wl.amp in ("bf16", "fp16"):
        return 2
    return DTYPE_BYTES[wl.weight_dtype]


def communication(
    facts: ModelFacts,
    wl: Workload,
    gpu: GPUProfile,
    *,
    count: int,
    nodes: int,
    interconnect: str = "auto",
    network: str = "auto",
    networks: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    world = count * nodes
    if world == 1 or wl.engine == "none":
        return {"bytes_per_gpu_per_step": 0, "time_s": 0.0, "link": None, "formula": "single device: none"}
    if wl.adapters is not None and wl.engine in ("fsdp", "deepspeed"):
        return _sharded_adapters(facts, wl, gpu, count=count, nodes=nodes, interconnect=interconnect, network=network, networks=networks)
    p_bytes = facts.n_params * collective_bytes(wl)
    if method_of(wl.adapters).frozen_base:
        # LoRA/QLoRA: DDP all-reduces only the trainable tensors' gradients (fp32 adapters)
        from gpuplan.plan.estimate.memory.adapters import adapter_layout

        lay = adapter_layout(facts, wl.adapters)
        p_bytes = 4 * (lay.adapter_params + lay.saved_params)
    accum = wl.gradient_accumulation_steps
    n = wl.shard_world_size if wl.zero_stage else world
    ring = (n - 1) / n
    if wl.adapters is not None and wl.zero_stage == 3:
        # a sharded frozen base is all-gathered in forward and backward like any other
        # parameter (4-bit where QLoRA quantized it); only the adapters' gradients are reduced
        from gpuplan.plan.estimate.flops import matmul_params

        body = matmul_params(facts)[0] - matmul_params(facts)[1]
        stored = DTYPE_BYTES[wl.weight_dtype]
        base = (facts.n_params - body) * stored + body * (0.5 if wl.adapters.method == "qlora" else stored)
        volume = ring * (2 * base + p_bytes) * accum
        formula = (
            "all-gather of the frozen base in forward and backward + reduce-scatter of the adapters' "
            "gradients per micro-batch: (N-1)/N x (2 x base + adapters) x accum"
        )
    elif wl.zero_stage <= 1:
        volume, formula = 2 * ring * p_bytes, "all-reduce of gradients per step: 2(N-1)/N x P x b"
    elif wl.zero_stage == 2 and wl.engine == "fsdp":
        volume = 2 * ring * p_bytes * accum
        formula = "FSDP2 shard_grad_op: all-gather + reduce-scatter per micro-batch: 2(N-1)/N x P x b x accum"
    elif wl.zero_stage == 2:
        volume = ring * p_bytes * (accum + 1)
        formula = "reduce-scatter per micro-batch + all-gather per step: (N-1)/N x P x b x (accum + 1)"
    else:
        volume, formula = 3 * ring * p_bytes * accum, "2 all-gathers + reduce-scatter per micro-batch: 3(N-1)/N x P x b x accum"
    bw, link = bandwidth_gbps(gpu, 1 if n <= count else nodes, interconnect, network, networks or {})
    time_s = volume / (bw * 1e9)
    out = {"bytes_per_gpu_per_step": int(volume), "link": link, "link_gbyte_per_s": bw, "formula": formula}
    if wl.zero_stage == 3 and n < world:  # hybrid: shards replicated across nodes
        cross = 2 * (nodes - 1) / nodes * p_bytes / n
        cbw, clink = bandwidth_gbps(gpu, nodes, interconnect, network, networks or {})
        time_s += cross / (cbw * 1e9)
        out["cross_node_bytes_per_gpu_per_step"] = int(cross)
        out["cross_node_link"] = clink
        out["cross_link_gbyte_per_s"] = cbw
    if wl.engine == "fsdp" and wl.gradient_checkpointing:
        out["activation_checkpointing"] = (
            "FSDP's own (fsdp_config): each unit recomputes inside its backward, whose all-gather is counted above; no extra traffic"
        )
    out["time_s"] = time_s
    out["assumption"] = (
        "ring collectives at the link's datasheet bandwidth; the step time overlaps them with compute (plan/estimate/step_time/links.py)"
    )
    return out


def _sharded_adapters(facts: ModelFacts, wl: Workload, gpu: GPUProfile, **link: Any) -> dict[str, Any]:
    """LoRA/QLoRA under FSDP or ZeRO-3: the frozen base is gathered too (estimate/sharded_time.py, named terms)."""
    from gpuplan.plan.estimate.sharded_time import _volumes, describe, sharded_step_terms

    terms = sharded_step_terms(facts, wl, gpu, **link)
    n = max(wl.shard_world_size, 1)
    gathered, grads, _, _ = _volumes(facts, wl)
    accum = max(wl.gradient_accumulation_steps, 1)
    volume = accum * (n - 1) / n * ((gathered if wl.engine == "fsdp" or wl.zero_stage == 3 else 0) + grads)
    bw, name = bandwidth_gbps(
        gpu,
        1 if n <= link["count"] else link["nodes"],
        link.get("interconnect", "auto"),
        link.get("network", "auto"),
        link.get("networks") or {},
    )
    return {
        "bytes_per_gpu_per_step": int(volume),
        "link": name,
        "link_gbyte_per_s": bw,
        "formula": "all-gathers of the frozen base and adapters per unit + reduce-scatter of the adapters' "
        "gradients, every micro-batch; with offload the host-link copies and the CPU optimizer step",
        "terms": terms,
        "time_s": sum(terms.values()),
        "assumption": "ring collectives at the link's datasheet bandwidth, host copies at the PCIe figure, "
        f"no overlap (upper bound): {describe(terms) or 'none'}",
    }
