"""Default training efficiency (model-FLOPs utilisation) by GPU generation and model size.

Published MEASURED MFU, from docs/reference/gpu-reference.json
"training_efficiency" (row = the model named, on the GPU named, in that list), not one
constant. Between the measured sizes the MFU is interpolated linearly in log(params);
outside them the nearest size's value holds. These are multi-GPU FSDP runs tuned by
their authors with large batches: a Trainer run with small per-device batches lands
lower, which is what calibration (plan/calibration.py) measures and corrects.

The estimate divides the FLOPs the device executes (recomputation included) by this
fraction of the peak; for the rows without activation checkpointing (1B-13B) MFU and
hardware utilisation are the same number, for 30B and 70B (checkpointed) the HFU is
higher (71.1 vs 53.3 for MPT-70B on A100), so the curve is conservative there.
"""

from __future__ import annotations

import bisect
import math

from gpuplan.hardware.profile import GPUProfile

# (parameters, MFU), from mosaicml/llm-foundry scripts/train/benchmarking/README.md
# @061f2c7, BF16, seq 2048, FSDP FULL_SHARD (gpu-reference.json training_efficiency):
A100_CURVE = (
    (125e6, 0.4479),  # A100 80GB, MPT-125M, 8 GPUs
    (1e9, 0.5986),    # A100 80GB, MPT-1B, 8 GPUs
    (7e9, 0.6423),    # A100 80GB, MPT-7B, 8 GPUs, no act. ckpt
    (13e9, 0.5957),   # A100 80GB, MPT-13B, 8 GPUs, no act. ckpt
    (30e9, 0.553),    # A100 80GB, MPT-30B, 8 GPUs, act. ckpt
    (70e9, 0.5333),   # A100 80GB, MPT-70B, 64 GPUs, act. ckpt
)
HOPPER_CURVE = (
    (1e9, 0.4182),    # H100 80GB, MPT-1B, 8 GPUs
    (3e9, 0.4373),    # H100 80GB, MPT-3B, 16 GPUs
    (7e9, 0.4644),    # H100 80GB, MPT-7B, 8 GPUs, no act. ckpt
    (13e9, 0.3979),   # H100 80GB, MPT-13B, 8 GPUs, no act. ckpt
    (30e9, 0.4392),   # H100 80GB, MPT-30B, 32 GPUs, act. ckpt
    (70e9, 0.4257),   # H100 80GB, MPT-70B, 64 GPUs, act. ckpt
)
# RTX 4090, GPT-2 124M (karpathy/nanoGPT issue #182, 2023-03-02): nanoGPT printed 29%
# MFU against the A100's 312 TFLOP/s; against the 4090's own 165.2 bf16 peak that is
# 0.29 x 312 / 165.2 = 54.8%. The only measured row for GA10x/AD10x/GB20x cards.
GEFORCE_CURVE = ((124e6, 0.29 * 312 / 165.2),)
# AMD MI250 (Databricks, 2023-10-30, MPT-7B on 4-128 GPUs): 166 TFLOP/s per MI250
# against its 362.1 bf16 peak (two GCDs of 181) = 45.8%.
CDNA2_CURVE = ((7e9, 166 / 362.1),)
# No training MFU row for MI300X/MI325X: Hopper's curve scaled by the ratio of measured
# matmul ceilings (gpu-reference.json matmul_ceiling, stas00 MAMF: MI300X 51.4% of
# peak, H100 SXM 80.3%).
CDNA3_SCALE = 0.514 / 0.803

# CPU: measured on this project's build machine (2 cores): `gpuplan apply specs/tiny.toml`
# (the 4-layer, hidden-128 Llama, 200 steps of 16 x 128 tokens) ran at 17,344 tokens/s
# where the plan at 20% of the nominal peak (hardware/detect.py) said 11,978: 0.20 x
# 17,344 / 11,978 = 29% (README, "The main job", real output). CPU efficiency varies
# with the CPU, the load on it and the model far more than a GPU's (a model with under a
# million parameters is all framework overhead: benchmarks/RESULTS.md, "Time estimates
# (CPU)"): the first apply on a machine calibrates it.
CPU_UTILISATION = 0.29
CPU_SOURCE = "measured on a 2-core CPU (specs/tiny.toml, README)"


def _interpolate(curve: tuple[tuple[float, float], ...], n_params: int) -> float:
    xs = [math.log(p) for p, _ in curve]
    x = math.log(max(n_params, 1))
    if x <= xs[0]:
        return curve[0][1]
    if x >= xs[-1]:
        return curve[-1][1]
    i = bisect.bisect_right(xs, x)
    t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return curve[i - 1][1] + t * (curve[i][1] - curve[i - 1][1])


def default_efficiency(gpu: GPUProfile, n_params: int) -> tuple[float, str]:
    """(utilisation of the dense peak, where it comes from) for `gpu` training `n_params`."""
    size = f"{n_params / 1e9:.2g}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
    if gpu.is_cpu:
        return CPU_UTILISATION, CPU_SOURCE
    cc = gpu.compute_capability
    if gpu.vendor == "amd":
        if gpu.fp8:  # CDNA3 (MI300X, MI325X); CDNA2 has no fp8
            u = _interpolate(HOPPER_CURVE, n_params) * CDNA3_SCALE
            return u, (f"published H100 MFU at {size} (llm-foundry) x MI300X/H100 measured matmul ceiling "
                       "(51.4%/80.3%, stas00 MAMF)")
        return _interpolate(CDNA2_CURVE, n_params), "published MI250 MFU, MPT-7B (Databricks 2023)"
    if cc is not None and cc >= (9, 0) and cc < (12, 0):
        note = "" if cc < (10, 0) else "; no published Blackwell bf16 MFU, Hopper's used"
        return _interpolate(HOPPER_CURVE, n_params), f"published H100 MFU at {size} (llm-foundry){note}"
    if cc is not None and cc != (8, 0) and cc >= (8, 6):
        return _interpolate(GEFORCE_CURVE, n_params), "published RTX 4090 MFU, GPT-2 124M (nanoGPT #182)"
    note = "" if cc == (8, 0) else "; no published row for this generation, A100's used"
    return _interpolate(A100_CURVE, n_params), f"published A100 MFU at {size} (llm-foundry){note}"
