"""Terms that cross a link: data-parallel collectives and FSDP / ZeRO CPU offload. Pure.

Collectives: the bytes per GPU per step from plan/estimate/communication.py (ring all-reduce,
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
parameter shard crosses the host link (catalog `pcie`) host-to-device for each
all-gather, the gradient shard device-to-host, and the optimizer step runs on the CPU
over host memory bandwidth (catalog "cpu" entry). FSDP's offload copies are blocking
(torch/distributed/fsdp/_runtime_utils.py, _unshard copies with non_blocking on the
same stream as the all-gather): serial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.shape import StepShape
from gpuplan.plan.estimate.step_time.terms import Term


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
                "plan/estimate/communication.py; Zhao et al. 2023",
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
            "plan/estimate/communication.py; Li et al. 2020",
        )
    ]


def offload_terms(s: StepShape, wl: Workload, gpu: GPUProfile, host_bw: float) -> list[Term]:
    if not (wl.offload_params or wl.offload_optimizer):
        return []
    link = float(gpu.interconnect.get("pcie", 16.0)) * 1e9 * K.PCIE_FRACTION
    shards = max(wl.shard_world_size, 1)
    out = []
    if wl.offload_params:
        gathers = 3 if s.checkpointing else 2
        params = s.n_params * s.stored_weight_bytes / shards * gathers
        grads = s.trainable_params * s.grad_bytes / shards
        out.append(
            Term(
                "CPU offload copies",
                "offload",
                (params + grads) / link,
                "micro-batch",
                "serial",
                f"parameter shard host-to-device x {gathers} gathers + gradient shard device-to-host, over the host link",
                "FSDP CPUOffload; catalog pcie",
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
                "DeepSpeed ZeRO-Offload; catalog pcie",
            )
        )
    return out
