"""Data-parallel communication per optimizer step, in seconds: the links, the plan's communication
section, the sharded engines' named terms, and how the step-time model overlaps them. Pure, no torch.

The bytes are plan/estimate/comm_volumes.py's. Bandwidth: NVLink (or PCIe) inside one node; across
nodes the network, assuming one NIC per GPU as on HGX/DGX nodes. `communication()` is the plan's
section (its `time_s` assumes no overlap with compute, an upper bound); the step-time model prices
the same bytes as the terms below, with the overlap they state.

Sharded terms (sharded_step_terms: all-gathers, reduce-scatters and, with CPU offload, FSDP2
CPUOffloadPolicy / DeepSpeed offload_optimizer / offload_param): before each all-gather a rank copies
its shard host -> GPU, after each reduce-scatter its gradient shard GPU -> host (torch _fsdp_param.py,
_fsdp_collectives.py: the sharded gradient is moved to the CPU), and the optimizer steps on the CPU:
its traffic (fp32 value, gradient and two Adam states read, three written: 24 bytes per element) at
CPU_OPTIMIZER_BYTES_PER_S. The host link is the GPU's PCIe figure in the catalog
(hardware/catalog.toml interconnect.pcie), which pinned DMA copies reach HOST_COPY_FRACTION of
(step_time/constants.py). These times assume no overlap with compute.

Step-time terms (communication_terms, offload_terms), what the step-time model adds.
Collectives: the bytes per GPU per step from plan/estimate/comm_volumes.py (ring all-reduce,
reduce-scatter, all-gather volumes), over the link's datasheet bandwidth, PCIe links at
PCIE_FRACTION of it. Overlap, stated: sharded engines (ZeRO-2/3, FSDP) move their bytes
every micro-batch on a stream of their own, prefetching the next unit while this one
computes (Zhao et al. 2023, "PyTorch FSDP", sec. 3.3): per micro-batch the step takes
max(compute, collectives). DDP / ZeRO-1 all-reduce the gradients once per optimizer
step, bucketed during the last micro-batch's backward (Li et al. 2020, "PyTorch
Distributed", sec. 3.2.3): only what outlasts that backward is exposed. Over PCIe the
collectives are serial: GeForce and many PCIe boxes have no GPU peer-to-peer, so NCCL
stages every transfer through host memory with CPU proxy threads (NCCL docs, "SHM
transport"), at PCIE_FRACTION of the catalog figure (fitted on the 2 x RTX 3090 and
RTX 6000 Ada rows of fsdp_qlora).

CPU offload (FSDP CPUOffload(offload_params=True), DeepSpeed offload_optimizer): the
parameter shard crosses the host link (catalog `pcie`, at HOST_COPY_FRACTION: pinned DMA copies) host-to-device
for each all-gather, the gradient shard device-to-host, and the optimizer step runs on the CPU
over host memory bandwidth (catalog "cpu" entry). FSDP's offload copies are blocking
(torch/distributed/fsdp/_runtime_utils.py, _unshard copies with non_blocking on the
same stream as the all-gather): serial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.comm_volumes import dense_volume, sharded_step_volume, sharded_volumes
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.shape import StepShape
from gpuplan.plan.estimate.step_time.terms import Term

DEFAULT_NETWORK = "InfiniBand-NDR"
# Assumed CPU optimizer-step throughput in bytes of memory traffic per second: a fraction of one
# socket's DDR bandwidth (e.g. 8 channels of DDR4-3200 = 205 GB/s peak); torch's foreach AdamW on
# the CPU reaches far less than peak. An assumption, not a measurement: calibration replaces it.
CPU_OPTIMIZER_BYTES_PER_S = 20e9
ADAM_BYTES_PER_ELEMENT = 24  # fp32: param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written
TERMS = ("all_gather_s", "reduce_scatter_s", "host_to_device_s", "device_to_host_s", "cpu_optimizer_step_s")


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
        return sharded_adapters_section(
            facts, wl, gpu, count=count, nodes=nodes, interconnect=interconnect, network=network, networks=networks
        )
    v = dense_volume(facts, wl, world=world, nodes=nodes)
    bw, link = bandwidth_gbps(gpu, 1 if v.group <= count else nodes, interconnect, network, networks or {})
    time_s = v.bytes_per_gpu / (bw * 1e9)
    out = {"bytes_per_gpu_per_step": int(v.bytes_per_gpu), "link": link, "link_gbyte_per_s": bw, "formula": v.formula}
    if v.cross_node_bytes:  # hybrid: shards replicated across nodes
        cbw, clink = bandwidth_gbps(gpu, nodes, interconnect, network, networks or {})
        time_s += v.cross_node_bytes / (cbw * 1e9)
        out["cross_node_bytes_per_gpu_per_step"] = int(v.cross_node_bytes)
        out["cross_node_link"] = clink
        out["cross_link_gbyte_per_s"] = cbw
    if wl.engine == "fsdp" and wl.gradient_checkpointing:
        out["activation_checkpointing"] = (
            "FSDP's own (fsdp_config): each unit recomputes inside its backward, whose all-gather is counted above; no extra traffic"
        )
    out["time_s"] = time_s
    out["assumption"] = (
        "ring collectives at the link's datasheet bandwidth; the step time overlaps them with compute (plan/estimate/comm_time.py)"
    )
    return out


def sharded_adapters_section(facts: ModelFacts, wl: Workload, gpu: GPUProfile, **link: Any) -> dict[str, Any]:
    """LoRA/QLoRA under FSDP or ZeRO-3: the frozen base is gathered too (the named terms of sharded_step_terms)."""
    terms = sharded_step_terms(facts, wl, gpu, **link)
    n = max(wl.shard_world_size, 1)
    volume = sharded_step_volume(facts, wl)
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
        "assumption": f"ring collectives at the link's datasheet bandwidth, host copies at {K.HOST_COPY_FRACTION:.0%} of "
        "the PCIe figure (pinned DMA copies), "
        f"no overlap (upper bound): {describe(terms) or 'none'}",
    }


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
    gathered, grads, shard, local_trainable = sharded_volumes(facts, wl)
    ring = (n - 1) / n
    bw, _ = bandwidth_gbps(gpu, 1 if n <= count else nodes, interconnect, network, networks or {})
    if wl.engine == "fsdp" or wl.zero_stage == 3:
        out["all_gather_s"] = accum * ring * gathered / (bw * 1e9)
    out["reduce_scatter_s"] = accum * ring * grads / (bw * 1e9)
    if wl.offload_params or wl.offload_optimizer:
        host = gpu.interconnect.get("pcie", 16.0) * 1e9 * K.HOST_COPY_FRACTION
        if wl.offload_params:
            out["host_to_device_s"] = accum * shard / host
        out["device_to_host_s"] = accum * grads / n / host
        out["cpu_optimizer_step_s"] = ADAM_BYTES_PER_ELEMENT * local_trainable / CPU_OPTIMIZER_BYTES_PER_S
    return out


def describe(terms: Mapping[str, float]) -> str:
    return ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.3g} s" for k, v in terms.items() if v)


def _link_speed(comm: Mapping[str, Any], key: str = "link") -> float:
    bw = float(comm.get("link_gbyte_per_s") or 16.0) * 1e9
    return bw * K.PCIE_FRACTION if comm.get(key) == "PCIe" else bw


def communication_terms(comm: Mapping[str, Any] | None, wl: Workload) -> list[Term]:
    if not comm or not comm.get("bytes_per_gpu_per_step"):
        return []
    t = comm["bytes_per_gpu_per_step"] / _link_speed(comm)
    if comm.get("cross_node_bytes_per_gpu_per_step"):
        t += comm["cross_node_bytes_per_gpu_per_step"] / (float(comm.get("cross_link_gbyte_per_s") or 50.0) * 1e9)
    pcie = comm.get("link") == "PCIe"
    kind, how = ("serial", "serial (PCIe: staged through host memory)") if pcie else ("link", "overlapped with compute")
    if wl.zero_stage >= 2:
        return [
            Term(
                "collectives (sharded)",
                "communication",
                t / wl.gradient_accumulation_steps,
                "micro-batch",
                kind,
                f"{comm['formula']} over {comm.get('link')}, per micro-batch, {how}",
                "plan/estimate/comm_volumes.py; Zhao et al. 2023",
            )
        ]
    return [
        Term(
            "gradient all-reduce",
            "communication",
            t,
            "step",
            kind,
            f"{comm['formula']} over {comm.get('link')}, {how if pcie else 'overlapped with the last backward'}",
            "plan/estimate/comm_volumes.py; Li et al. 2020",
        )
    ]


def offload_terms(s: StepShape, wl: Workload, gpu: GPUProfile, host_bw: float) -> list[Term]:
    if not (wl.offload_params or wl.offload_optimizer):
        return []
    link = float(gpu.interconnect.get("pcie", 16.0)) * 1e9 * K.HOST_COPY_FRACTION  # DMA copies, not NCCL's staging
    shards = max(wl.shard_world_size, 1)
    out = []
    if wl.offload_params:
        # each gather copies the shard up first (torch fsdp/_fully_shard/_fsdp_param.py), as many as comm_volumes.py
        # counts all-gathers: a FULL_SHARD / ZeRO-3 unit twice per micro-batch, checkpointed or not, SHARD_GRAD_OP once.
        # The recomputed forward runs on the backward's unshard: FSDP2's _pre_forward in PRE_BACKWARD unshards nothing
        # new (_fsdp_state.py) under the non-reentrant checkpointing apply runs, FSDP1's hooks sit outside a
        # checkpoint_wrapper'd layer, and DeepSpeed keeps a recomputed module's parameters for its backward, reused within
        # stage3_max_reuse_distance (partitioned_param_coordinator.py __params_to_release).
        gathers = 2 if wl.zero_stage >= 3 else 1
        params = s.n_params * s.stored_weight_bytes / shards * gathers
        grads = s.trainable_params * s.grad_bytes / shards
        out.append(
            Term(
                "CPU offload copies",
                "offload",
                (params + grads) / link,
                "micro-batch",
                "serial",
                f"parameter shard host-to-device x {gathers} gather{'s' if gathers > 1 else ''} + gradient shard device-to-host, over "
                f"the host link at {K.HOST_COPY_FRACTION:.0%}",
                f"FSDP CPUOffload; catalog pcie; {K.HOST_COPY_SOURCE}",
            )
        )
    else:  # optimizer offload: gradients down and parameters up once per step
        t = s.trainable_params / shards * (s.grad_bytes + s.act_bytes)
        out.append(
            Term(
                "CPU offload copies",
                "offload",
                t / link,
                "step",
                "serial",
                "gradient shard device-to-host + parameter shard host-to-device per step, over the host link",
                f"DeepSpeed ZeRO-Offload; catalog pcie; {K.HOST_COPY_SOURCE}",
            )
        )
    return out
