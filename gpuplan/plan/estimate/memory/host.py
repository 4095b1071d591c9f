"""Host RAM per node: loading the weights, offloaded states, pinned buffers. Pure arithmetic, no torch.

What the libraries apply runs do with host RAM (transformers 5.24, accelerate 1.15, torch 2.13):
- Loading, every rank: each rank's from_pretrained builds the model on the meta device and fills
  it tensor by tensor from the memory-mapped safetensors (transformers 5.24 modeling_utils.py), so
  each rank holds its whole model in host RAM once: model.dtype x P for a 16-bit or fp32 base,
  which the Trainer then moves to its GPU. There is no rank-0-only read in transformers 5.24:
  under FSDP's cpu_ram_efficient_loading (and only with ACCELERATE_USE_FSDP, which torchrun does
  not set: distributed/fsdp.py is_fsdp_enabled) modeling_utils.py reads it only for missing keys
  and non-persistent buffers (:4862, :4898); accelerate then moves every rank's copy to meta and
  broadcasts rank 0's (fsdp_utils.py fsdp2_load_full_state_dict), after every rank has read it,
  and skips even that for a bitsandbytes 4-bit model (fsdp_utils.py:830).
- QLoRA under FSDP with CPU offload: apply loads the 4-bit base into host RAM (device_map "cpu":
  bitsandbytes quantizes there) so a base larger than one GPU is never whole on it; each rank holds
  the packed weights, their QuantStates and the fp32 rest (prepare_model_for_kbit_training)
  until fully_shard moves its shard to the GPU (or keeps it on the host, with offload).
  Elsewhere a 4-bit model loads straight onto its GPU (quantizer_bnb_4bit.py update_device_map),
  whole before FSDP shards it (memory/adapters.py counts that load on the GPU): host RAM holds
  the tensors in flight only (not counted: the page cache is reclaimable).
- Offload: FSDP2's CPUOffloadPolicy (pin_memory=True) and DeepSpeed's offload_optimizer /
  offload_param (pin_memory = true in apply's config) keep the sharded states per rank in host
  RAM (memory/sharding.py, memory/adapters_sharded.py), the parameter shards page-locked.
- Not counted: the Python process, CUDA libraries and the dataloader workers of each rank.
The peak is the larger of loading and training: fully_shard replaces one unit's parameters by
their shards at a time, so the whole loaded model and the offloaded shards do not coexist.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.units import GIB


@dataclass(frozen=True)
class HostMemory:
    """Bytes of host RAM on one node."""

    loading: int  # while from_pretrained runs on every rank of the node
    offloaded: int  # states kept in host RAM while training (all ranks of the node)
    pinned: int  # of offloaded, page-locked
    peak: int
    loading_how: str

    def to_dict(self) -> dict[str, int | str]:
        return {
            "loading_bytes": self.loading,
            "offloaded_bytes": self.offloaded,
            "pinned_bytes": self.pinned,
            "peak_bytes": self.peak,
            "loading": self.loading_how,
        }

    def describe(self, count: int) -> str:
        return (
            f"{self.peak / GIB:.0f} GiB of host RAM per node ({count} rank{'s' if count != 1 else ''}): loading "
            f"{self.loading / GIB:.0f} GiB ({self.loading_how}), offloaded states {self.offloaded / GIB:.0f} GiB "
            f"({self.pinned / GIB:.0f} GiB of it pinned)"
        )


def loaded_model_bytes(facts: ModelFacts, wl: Workload) -> int:
    """One rank's whole model in host RAM after from_pretrained (before any sharding)."""
    a = wl.adapters
    if a is not None and a.method == "qlora":
        from gpuplan.plan.estimate.memory.quant4 import base_4bit_split

        q_bytes, _, rest, _ = base_4bit_split(facts, a.double_quant)
        return q_bytes + 4 * rest
    return DTYPE_BYTES[wl.weight_dtype] * facts.n_params


def host_memory(facts: ModelFacts, wl: Workload, host_bytes_per_rank: int, pinned_per_rank: int, count: int) -> HostMemory:
    """Host RAM of one node of `count` ranks."""
    qlora = wl.adapters is not None and wl.adapters.method == "qlora"
    offload = wl.offload_params or wl.offload_optimizer
    if qlora and wl.device == "cuda" and not (wl.engine == "fsdp" and offload):
        loading, how = 0, "4-bit straight onto each GPU"
    else:
        loading = count * loaded_model_bytes(facts, wl)
        how = "every rank loads the whole " + ("4-bit base into host RAM" if qlora else f"{wl.weight_dtype} model")
    offloaded = count * host_bytes_per_rank
    return HostMemory(loading, offloaded, count * pinned_per_rank, max(loading, offloaded), how)
