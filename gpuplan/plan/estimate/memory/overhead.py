"""What the GPU holds beyond live tensors: allocator reserve, CUDA context, cuBLAS workspace.

Shared by the analytic and the traced estimate, so the two differ only in the tensor peak.
Sources and assumptions (no GPU was available to measure them here; benchmarks/
gpu_check.py measures them where one is):
- PyTorch CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every block is
  rounded up to a multiple of 512 bytes; requests <= 1 MiB come from 2 MiB segments,
  larger ones from segments rounded to 2 MiB (20 MiB for 1-10 MiB requests); freed
  blocks stay reserved. Fragmentation reserve assumed at 5% of the tensor peak plus
  one 20 MiB large-segment slack (PyTorch docs "CUDA semantics: memory management":
  reserved >= allocated; the gap observed in practice is a few percent for
  steady training loops).
- CUDA context with lazy module loading (CUDA >= 11.7, CUDA_MODULE_LOADING=LAZY,
  the torch default): about 300-600 MiB depending on driver and GPU; 512 MiB assumed.
- cuBLAS workspace (aten/src/ATen/cuda/CublasHandlePool.cpp defaults, see below), one
  handle for a single-stream training loop. Unknown GPU: the pre-Hopper size.
"""

from __future__ import annotations

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.estimate.memory.types import COMPONENTS
from gpuplan.units import MIB

CUDA_CONTEXT_BYTES = 512 * MIB
ALLOCATOR_FRAGMENTATION = 0.05
ALLOCATOR_SLACK_BYTES = 20 * MIB


def cublas_workspace_bytes(compute_capability: tuple[int, int] | None) -> int:
    """torch's default cuBLAS workspace per handle (CublasHandlePool.cpp, when
    CUBLAS_WORKSPACE_CONFIG is unset): 32 MiB on Hopper and newer, else
    ":4096:2:16:8" = 2 x 4 MiB + 8 x 16 KiB."""
    if compute_capability is not None and compute_capability >= (9, 0):
        return 32 * MIB
    return 2 * 4 * MIB + 8 * 16 * 1024


def overhead_bytes(allocated_peak: int, device: str, compute_capability: tuple[int, int] | None) -> int:
    """reserved_peak - allocated_peak: what nvidia-smi shows beyond live tensors."""
    if device != "cuda":
        return 0
    reserve = int(allocated_peak * ALLOCATOR_FRAGMENTATION) + ALLOCATOR_SLACK_BYTES
    return CUDA_CONTEXT_BYTES + cublas_workspace_bytes(compute_capability) + reserve


def peak_moment(moments: list[dict[str, int]], device: str, gpu: GPUProfile | None) -> tuple[int, int, dict[str, int]]:
    """The largest of a step's moments (bytes by component): its allocated bytes, the overhead beyond them on
    this device (overhead_bytes), and its components with that overhead among them."""
    peak = max(moments, key=lambda c: sum(c.values()))
    allocated = sum(peak.values())
    cc = gpu.compute_capability if gpu is not None else None
    overhead = overhead_bytes(allocated, device, cc)
    components = {k: int(peak.get(k, 0)) for k in COMPONENTS if k != "overhead"}
    components["overhead"] = overhead
    return allocated, overhead, components
