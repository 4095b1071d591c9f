"""The step-time model's constants: fixed ones with their source, fitted ones with their rows.

Fitted constants come from benchmarks/fit_step_time.py over the usable rows of
benchmarks/data/published-throughput.json; its headline figure is leave-one-source-out
(each source predicted by a fit without it: benchmarks/RESULTS.md, "Step-time fit"), and
every fitted constant stays inside a physical bound named there. They are per GPU
architecture class, never per SKU, model, row or source:
- `matmul_efficiency` (ETA): the fraction of the dtype's dense peak a large GEMM reaches,
  at most the class's measured Maximum Achievable Matmul FLOPS (MAMF).
- `kernel_s` (KERNEL_S): host time of one eager PyTorch kernel launch (op dispatch, autograd).
The rest are global (the same on every GPU class), fitted over all rows at once; a CPU has
constants of its own (CPU below: its Trainer step, CPU_TRAINER_STEP_S, is measured, not fitted).

A class with no published row takes a fitted class's value and says so
(`ArchConstants.source`, BORROWED); one with a single row keeps its physical prior (ETA_PRIOR). A measured run on this hardware
(plan/estimate/calibration.py) scales them; the shape of the model stays.
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
    flash_relative: float = 0.75  # flash attention's FLOP rate relative to a GEMM's (FLASH_RELATIVE)
    # the HF Trainer's host seconds per optimizer step; None: the figure fitted on the published GPU runs
    # (TRAINER_STEP_S, read when the step is priced, so that fit_step_time.py's trial values reach it)
    trainer_step_s: float | None = None
    trainer_step_source: str = ""

    def trainer_step(self) -> tuple[float, str]:
        """(the Trainer's per-step host seconds this class prices, their source): its own, else the GPU fit's
        TRAINER_STEP_S as it stands when called (fit_step_time.py sets it)."""
        return (TRAINER_STEP_S, FIT_SOURCE) if self.trainer_step_s is None else (self.trainer_step_s, self.trainer_step_source)


# Fitted (benchmarks/fit_step_time.py over every usable row; its headline error is
# leave-one-source-out: benchmarks/RESULTS.md, "Step-time fit"). Each has a physical bound
# (fit_step_time.py PARAMS, with the bound's source) that the fit stays inside.
#
# Large-GEMM fraction of the dense dtype peak per architecture class with published rows,
# at most the class's Maximum Achievable Matmul FLOPS fraction (MAMF below: the fastest any
# GEMM shape ran on that chip). Source rows: "ampere-dc" A100 (Qwen README, ms-swift, fsdp_qlora, fms-acceleration),
# "hopper" H100 (torchtitan, fsdp_qlora), "ampere" RTX 3090 (fsdp_qlora).
ETA = {"ampere-dc": 0.7451, "hopper": 0.4477, "ampere": 1.034}
# tokens per micro-batch at which a 4096-wide GEMM reaches half of `matmul_efficiency`: the
# achievable fraction is eta * MN / (MN + M_HALF * 4096) (a small output M x N leaves SMs idle:
# wave quantization and tile under-fill; the roofline's weight-read bound is separate).
M_HALF_TOKENS = 447.4
# ... for a GEMM whose output is this many columns wide; a GEMM of N columns reaches half at
# M_HALF_TOKENS x GEMM_REFERENCE_WIDTH / N rows (terms.gemm_efficiency: the output tiles fill the SMs).
GEMM_REFERENCE_WIDTH = 4096
# Host seconds per optimizer step the HF Trainer loop spends outside the model
# (dataloader, logging, LR scheduler, callbacks, the .item() syncs of logging).
TRAINER_STEP_S = 0.002794
# Achieved fraction of HBM bandwidth of the 4-bit dequantization kernels (bitsandbytes
# dequantize_4bit, GPTQ/exllama): far below a streaming copy, many small launches.
DEQUANT_BW_FRACTION = 0.2048
# DeepSpeed ZeRO-3 host cost per parameter tensor per pass (pre/post hooks that fetch,
# release and partition each module's parameters: deepspeed/runtime/zero/
# partitioned_param_coordinator.py), seconds. Its prior is measured (benchmarks/zero_overhead.py).
ZERO3_HOOK_S = 0.0003077
# Achieved fraction of the catalog PCIe figure for GPU-to-GPU collectives over PCIe (PCIe protocol overhead ~ 80%;
# GeForce cards have no PCIe P2P, so NCCL stages through host memory). Host copies are HOST_COPY_FRACTION's.
PCIE_FRACTION = 0.1033
# Host seconds per eager kernel launch (op dispatch, autograd node, the CUDA launch).
KERNEL_S = 1.567e-05

# Fixed (not fitted):
# DeepSpeed ZeRO-2 host cost per trainable parameter tensor per micro-batch: each
# gradient's backward hook copies it into the reduce bucket (deepspeed/runtime/zero/stage_1_and_2.py
# reduce_ready_partitions_and_remove_grads). Measured with a real DeepSpeed engine against the plain
# model on one CPU rank (benchmarks/zero_overhead.py, benchmarks/data/zero_overhead.json): the only
# published rows that run ZeRO-2 (the Qwen README's Int4 runs) cannot tell it from the other fixed costs.
# Stage 1 is not here: its hook copies nothing, and its per-tensor reduce runs once per step at the
# accumulation boundary (reduce_gradients), which the benchmark does not time: not priced.
ZERO2_HOOK_S = 9.36e-05
ZERO2_HOOK_SOURCE = "measured: benchmarks/zero_overhead.py (DeepSpeed's hooks on one CPU rank)"
# Achieved fraction of the catalog PCIe figure by pinned host <-> device copies (DMA from page-locked memory: FSDP's
# CPU-offloaded parameter shards, DeepSpeed's offloaded optimizer, offloaded activations): "On PCI-Express 2.0
# systems we have measured up to 6.0 GB/sec transfer rates" (NVIDIA CUDA FAQ, bandwidthTest) of the 8 GB/s a PCIe 2.0
# x16 link carries. Not PCIE_FRACTION: that one is NCCL's GPU-to-GPU path staged through host memory by proxy threads.
HOST_COPY_FRACTION = 0.75
HOST_COPY_SOURCE = (
    f"pinned DMA copies at {HOST_COPY_FRACTION:.0%} of the catalog PCIe figure (NVIDIA CUDA FAQ: 6.0 of 8 GB/s on PCIe 2.0 x16)"
)
# Achieved fraction of the datasheet HBM bandwidth by streaming elementwise kernels:
# ~80-90% in STREAM-like copies (NVIDIA A100 tuning guide; Jia et al. 2018,
# "Dissecting the NVIDIA Volta GPU architecture via microbenchmarking", 80-88%).
HBM_FRACTION = 0.8
# Flash attention's throughput relative to a dense GEMM of the same FLOPs: FA2 reaches
# 50-73% of A100 peak forward and less backward (Dao 2023, "FlashAttention-2", sec. 4.1)
# where cuBLAS GEMMs reach ~80%: about 0.75 of the GEMM efficiency.
FLASH_RELATIVE = 0.75
# On Hopper (and Blackwell, priced with Hopper's constants), torch's SDPA flash kernel is
# FlashAttention-2, which does not use the wgmma
# tensor-core path: "FlashAttention-2 achieves only 35% utilization on the H100 GPU" (Shah et
# al. 2024, "FlashAttention-3", abstract), against MAMF's 80%: 0.35 / 0.80 of the GEMM rate.
FLASH_RELATIVE_HOPPER = 0.35 / 0.80
# Overlap of communication with compute (FSDP prefetch, DDP bucketed all-reduce during
# backward: Li et al. 2020 "PyTorch Distributed", Zhao et al. 2023 "PyTorch FSDP"):
# a micro-batch takes max(compute, collectives); a CPU-offload copy is serial.

# Maximum Achievable Matmul FLOPS as a fraction of the datasheet dense bf16 peak, measured
# with mamf-finder.py over thousands of shapes (S. Bekman, "Machine Learning Engineering",
# compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table"):
# A100 SXM 267.9 of 312 TFLOP/s, H100 SXM 792.1 of 989, B200 SXM 1745 of 2250, MI250X 147.0
# of 191.5 (one GCD), MI300X 781.9 of 1300. They bound the fitted ETA (a training GEMM is
# no faster than the best shape); a class with no measurement is bounded by MAMF_DEFAULT.
# Consumer Ampere: torch.mm over square bf16 matrices of 1,024-10,240, the fastest size, 30 iterations timed by CUDA
# events (zzc0721/torch-performance-test-data, test.py and database.md at 9d82827): three RTX 3090 entries, 76.34,
# 76.58 and 76.68 TFLOP/s, median 76.58 of the GA102 whitepaper's 71 (a GeForce card boosts past its rated
# 1695 MHz while power allows). The same table gives the A100 SXM4 80GB 264.53/312 = 0.848 and the H100 SXM
# 797.51/989 = 0.806 where Bekman's sweep gives 0.859 and 0.801: a maximum over five shapes, within 1.3% of one over
# thousands. A bound at stock power: the fsdp_qlora rig that is the class's rows capped its 3090s at 280 W.
MAMF = {
    "ampere-dc": (0.859, "MAMF A100 SXM 267.9/312 TFLOP/s (Bekman, ml-engineering)"),
    "hopper": (0.801, "MAMF H100 SXM 792.1/989 TFLOP/s (Bekman, ml-engineering)"),
    "ampere": (
        1.079,
        "fastest torch.mm bf16 over square sizes 1,024-10,240, RTX 3090 76.58/71 TFLOP/s, the median of three entries "
        "(zzc0721/torch-performance-test-data database.md; GeForce boosts past its rated clock)",
    ),
    "blackwell": (0.776, "MAMF B200 SXM 1745/2250 TFLOP/s (Bekman, ml-engineering)"),
    "cdna2": (0.767, "MAMF MI250X 147.0/191.5 TFLOP/s per GCD (Bekman, ml-engineering)"),
    "cdna3": (0.601, "MAMF MI300X 781.9/1300 TFLOP/s (Bekman, ml-engineering)"),
}
MAMF_DEFAULT = (
    1.0,
    "no MAMF measured for this class: the datasheet peak, at the rated boost clock (a GeForce card runs past it while "
    "power allows: the RTX 3090, rated 1695 MHz in the GA102 whitepaper, measured 1.079 of it, MAMF above)",
)
# Classes with a single published row keep their physical prior (PRIOR_OF_BOUND of their bound, the prior
# fit_step_time.py's folds keep a constant none of their rows depends on at): any constant that moves one row meets
# that row exactly, so a fraction fitted to it is the row's residual, not a measurement of the GEMMs (the refits of
# STEP_MODEL 4 to 6 moved Ada's between 0.80 and 1.0 as other terms changed). The row stays in the fit, predicted
# with the prior, as a check. "ada": one row, 70B QLoRA on 2 x RTX 6000 Ada (fsdp_qlora), 21% GEMMs and 48% PCIe
# collectives.
PRIOR_OF_BOUND = 0.8
ETA_PRIOR = {c: PRIOR_OF_BOUND * MAMF.get(c, MAMF_DEFAULT)[0] for c in ("ada",)}
# Classes without a published row take a fitted class's GEMM fraction (named in `source`):
# Volta and Turing the A100's (tensor-core fp16 HGEMMs of the same cuBLAS tile kernels;
# Megatron-LM's 39 TFLOP/s per V100, 30% of the fp16 peak for a whole step of a 1.2B model,
# Shoeybi et al. 2019 sec. 5.1, is checked against the resulting plan in tests/plan/
# test_step_time.py), Blackwell and CDNA3 Hopper's, consumer Blackwell Ada's, CDNA2 the A100's.
BORROWED = {
    "volta": "ampere-dc",
    "turing": "ampere-dc",
    "blackwell": "hopper",
    "blackwell-consumer": "ada",
    "cdna2": "ampere-dc",
    "cdna3": "hopper",
}
# fp32 matmuls on CUDA cores (no tensor cores: Volta/Turing fp32, or TF32 off on Ampere+):
# the same GEMM fraction of the datasheet FP32 peak (V100 15.7 TFLOP/s: NVIDIA Tesla V100
# datasheet; 8x below its 125 TFLOP/s fp16 tensor peak) as the tensor-core one of theirs.
# Before, Volta carried a whole-step fraction (Megatron's 30%) as its GEMM fraction, so
# every other term was counted twice and V100 fp32 came out ~2x too slow.
FP32_CUDA_CORES = "fp32 on CUDA cores (no tensor cores): of the datasheet FP32 peak"
CPU_KERNEL_S = 3e-5
# The HF Trainer's host work per optimizer step on a CPU (logging, scheduler, callbacks, collation):
# measured, a real Trainer's step against a hand loop over the same tensors, 8 micro-batches, logging
# every step, on one CPU core (benchmarks/host_overhead.py, benchmarks/data/host_overhead.json:
# trainer_step_s). Not TRAINER_STEP_S: that one is fitted on published GPU runs (at its 0.1 s bound,
# benchmarks/RESULTS.md), and priced a tiny CPU run's step at 5x what it measured (time_accuracy.py).
CPU_TRAINER_STEP_S = 3.21e-3
CPU_TRAINER_SOURCE = "measured: benchmarks/host_overhead.py (a real Trainer's step against a hand loop, one CPU core)"


def _gpu_constants(cls: str) -> ArchConstants:
    flash = FLASH_RELATIVE_HOPPER if cls in ("hopper", "blackwell") else FLASH_RELATIVE
    if cls in ETA:
        return ArchConstants(cls, ETA[cls], KERNEL_S, f"{FIT_SOURCE} ({cls} rows)", flash)
    if cls in ETA_PRIOR:
        return ArchConstants(cls, ETA_PRIOR[cls], KERNEL_S, _prior_source(cls), flash)
    other = BORROWED[cls]
    if other in ETA_PRIOR:
        return ArchConstants(cls, ETA_PRIOR[other], KERNEL_S, f"no published row for {cls}, {other}'s used: {_prior_source(other)}", flash)
    return ArchConstants(cls, ETA[other], KERNEL_S, f"{FIT_SOURCE}; no published row for {cls}, {other}'s used", flash)


def _prior_source(cls: str) -> str:
    return (
        f"GEMM fraction: the physical prior, {PRIOR_OF_BOUND:g} x its bound of {MAMF.get(cls, MAMF_DEFAULT)[0]:g} x "
        f"the peak ({cls} has one published row, too few to fit it: step_time/constants.py ETA_PRIOR); kernel cost "
        f"{FIT_SOURCE}"
    )


# CPU: the peak and bandwidth come from hardware/cpu_probe.py (measured on the machine), so
# the matmul fraction is of a measured 512^3 matmul rate (0.9: larger GEMMs run a little
# better, small ones worse, not fitted); the per-op cost is an estimate of eager PyTorch's
# dispatch plus autograd on a CPU (~30 us, not fitted). benchmarks/time_accuracy.py checks
# the resulting default against runs on this machine (benchmarks/RESULTS.md).
CPU = ArchConstants(
    "cpu",
    0.9,
    CPU_KERNEL_S,
    "CPU: peak and bandwidth measured by hardware/cpu_probe.py; 30 us per op, an estimate checked by benchmarks/time_accuracy.py",
    trainer_step_s=CPU_TRAINER_STEP_S,
    trainer_step_source=CPU_TRAINER_SOURCE,
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


def constants_for(gpu: GPUProfile, dtype: str | None = None) -> ArchConstants:
    """The class's constants; `dtype` "fp32" on a GPU: the matmuls run on CUDA cores."""
    cls = arch_class(gpu)
    if cls == "cpu":
        return CPU
    c = _gpu_constants(cls)
    if dtype == "fp32":
        return dataclasses.replace(c, source=f"{c.source}; {FP32_CUDA_CORES}")
    if gpu.matmul_max is not None:
        # the class's fraction is of the peak its reference card reaches at best (MAMF); this card's best is its own
        ref = cls if cls in ETA or cls in ETA_PRIOR else BORROWED[cls]
        bound = MAMF.get(ref, MAMF_DEFAULT)[0]
        return dataclasses.replace(
            c,
            matmul_efficiency=c.matmul_efficiency * gpu.matmul_max / bound,
            source=f"{c.source}; x {gpu.matmul_max:g} / {bound:g}: {gpu.name}'s fastest measured GEMM / the class's "
            "bound on it (hardware/catalog.toml matmul_max)",
        )
    return c
