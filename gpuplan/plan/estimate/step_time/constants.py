"""The step-time model's constants: fixed ones with their source, fitted ones with their rows.

Fitted constants come from benchmarks/fit_step_time.py over the usable rows of
benchmarks/data/published-throughput.json (benchmarks/RESULTS.md, "Step-time
model"). They are per GPU architecture class, never per SKU, model, row or source:
- `matmul_efficiency`: the fraction of the dtype's dense peak a large GEMM reaches.
- `kernel_s`: host time of one eager PyTorch kernel launch (op dispatch, autograd).
The rest are global (the same on every class), fitted over all rows at once.

A class with no published row takes the nearest fitted class's value and says so
(`ArchConstants.source`). A measured run on this hardware (plan/estimate/calibration.py)
scales them; the shape of the model stays.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpuplan.hardware.profile import GPUProfile

FIT_SOURCE = "fitted: benchmarks/fit_step_time.py on published-throughput.json"


@dataclass(frozen=True)
class ArchConstants:
    """What differs between GPU architecture classes."""

    name: str
    matmul_efficiency: float  # large-GEMM fraction of the dense dtype peak
    kernel_s: float  # host seconds per kernel launch (eager PyTorch)
    source: str


# Global constants, fitted (benchmarks/fit_step_time.py, all 103 usable rows together;
# objective 0.0960 = mean over sources of mean |log(plan / measured)|):
# tokens per micro-batch at which a GEMM reaches half of `matmul_efficiency`: the
# achievable fraction is eta * M / (M + M_HALF) (small M leaves SMs idle: wave
# quantization and tile under-fill; the roofline's weight-read bound is separate).
M_HALF_TOKENS = 330.0
# Host seconds per optimizer step the HF Trainer loop spends outside the model
# (dataloader, logging, LR scheduler, callbacks, the .item() syncs of logging); the fit
# is bounded at 50 ms (it wanted more, absorbing other terms' error: fit_step_time.py).
TRAINER_STEP_S = 0.05
# Achieved fraction of HBM bandwidth of the 4-bit dequantization kernels (bitsandbytes
# dequantize_4bit, GPTQ/exllama): far below a streaming copy, many small launches.
DEQUANT_BW_FRACTION = 0.16
# DeepSpeed ZeRO-3 host cost per parameter tensor per pass (pre/post hooks that fetch,
# release and partition each module's parameters: deepspeed/runtime/zero/
# partitioned_param_coordinator.py), seconds.
ZERO3_HOOK_S = 2.76e-4
# Achieved fraction of the catalog PCIe figure for GPU-to-GPU collectives and host
# copies (PCIe protocol overhead ~ 80%; GeForce cards have no PCIe P2P, so NCCL
# stages through host memory).
PCIE_FRACTION = 0.11

# Fixed (not fitted):
# Achieved fraction of the datasheet HBM bandwidth by streaming elementwise kernels:
# ~80-90% in STREAM-like copies (NVIDIA A100 tuning guide; Jia et al. 2018,
# "Dissecting the NVIDIA Volta GPU architecture via microbenchmarking", 80-88%).
HBM_FRACTION = 0.8
# Flash attention's throughput relative to a dense GEMM of the same FLOPs: FA2 reaches
# 50-73% of A100 peak forward and less backward (Dao 2023, "FlashAttention-2", sec. 4.1)
# where cuBLAS GEMMs reach ~80%: about 0.75 of the GEMM efficiency.
FLASH_RELATIVE = 0.75
# Overlap of communication with compute (FSDP prefetch, DDP bucketed all-reduce during
# backward: Li et al. 2020 "PyTorch Distributed", Zhao et al. 2023 "PyTorch FSDP"):
# a micro-batch takes max(compute, collectives); a CPU-offload copy is serial.

# Per-class fitted values. Source rows: "ampere-dc" A100 (Qwen README, fsdp_qlora),
# "hopper" H100 (torchtitan, fsdp_qlora), "ampere" RTX 3090 (fsdp_qlora), "ada"
# RTX 6000 Ada (fsdp_qlora).
FITTED = {
    "ampere-dc": ArchConstants("ampere-dc", 0.70, 1.68e-5, FIT_SOURCE + " (A100 rows)"),
    "hopper": ArchConstants("hopper", 0.40, 1.68e-5, FIT_SOURCE + " (H100 rows)"),
    "ampere": ArchConstants("ampere", 0.90, 1.68e-5, FIT_SOURCE + " (RTX 3090 rows)"),
    "ada": ArchConstants("ada", 0.80, 1.68e-5, FIT_SOURCE + " (RTX 6000 Ada rows)"),
}
# Volta: no row in the file; Shoeybi et al. 2019 (Megatron-LM, sec. 5.1) sustain 39 TFLOP/s
# on one V100 (30% of its 125 TFLOP/s fp16 peak, recompute counted) for a 1.2B model at
# 8 x 1024 tokens per micro-batch, where the matmuls are ~85% of the step: 0.30 / 0.85.
VOLTA = ArchConstants(
    "volta", 0.35, 1.68e-5, "Megatron-LM (Shoeybi et al. 2019) sec. 5.1: 39 TFLOP/s on one V100; per-kernel cost as fitted"
)
# Other classes without a published row borrow a fitted one (named in the source).
BORROWED = {"turing": "ampere", "blackwell": "hopper", "blackwell-consumer": "ada", "cdna2": "ampere-dc", "cdna3": "hopper"}
# CPU: the peak and bandwidth come from hardware/cpu_probe.py (measured on the machine), so
# the matmul fraction is of a measured 512^3 matmul rate (0.9: larger GEMMs run a little
# better, small ones worse, not fitted); the per-op cost is an estimate of eager PyTorch's
# dispatch plus autograd on a CPU (~30 us, not fitted). benchmarks/time_accuracy.py checks
# the resulting default against runs on this machine (benchmarks/RESULTS.md).
CPU = ArchConstants(
    "cpu",
    0.9,
    3e-5,
    "CPU: peak and bandwidth measured by hardware/cpu_probe.py; 30 us per op, an estimate checked by benchmarks/time_accuracy.py",
)


def arch_class(gpu: GPUProfile) -> str:
    """The architecture class of a catalog entry: by compute capability (NVIDIA) or generation (AMD)."""
    if gpu.is_cpu:
        return "cpu"
    if gpu.vendor == "amd":
        return "cdna3" if gpu.fp8 else "cdna2"
    cc = gpu.compute_capability or (8, 0)
    if cc < (7, 5):
        return "volta"
    if cc < (8, 0):
        return "turing"
    if cc == (8, 0):
        return "ampere-dc"
    if cc < (8, 9):
        return "ampere"
    if cc < (9, 0):
        return "ada"
    if cc < (10, 0):
        return "hopper"
    return "blackwell" if cc < (12, 0) else "blackwell-consumer"


def constants_for(gpu: GPUProfile) -> ArchConstants:
    cls = arch_class(gpu)
    if cls == "cpu":
        return CPU
    if cls in FITTED:
        return FITTED[cls]
    if cls == "volta":
        return dataclasses.replace(VOLTA, kernel_s=FITTED["ampere-dc"].kernel_s)
    other = FITTED[BORROWED[cls]]
    return dataclasses.replace(other, name=cls, source=f"{other.source}; no published row for {cls}, {other.name}'s used")
