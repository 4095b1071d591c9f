"""A vision-language model's vision tower as a step-time term (Term). Pure.

The tower runs over R = batch x images x tiles x tower tokens rows per micro-batch, not the text
tokens the language model's terms price (estimate/flops.py leaves the tower and projector out of
N for that reason): forward 2 x R x P_tower FLOPs for its matmuls (2 FLOPs per weight per row,
Kaplan et al. 2020, section 2.1) plus its attention, 4 x rows per image x width per row per block
(QK^T and PV over each image's own rows: Qwen2-VL's cu_seqlens blocks, a CLIP/SigLIP image;
Qwen2.5-VL's windowed blocks attend less, so this bounds them). Frozen (the default) the tower has
no backward at all (nothing in it requires grad); trained, its backward is twice its forward
(input and weight gradients), and checkpointed it is recomputed once more. GEMMs of R rows at
eta(R) of the dense peak (terms.gemm_efficiency); device work, per micro-batch.
"""

from __future__ import annotations

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.terms import Term, gemm_efficiency

NAME = "vision tower"


def tower_flops(facts: ModelFacts, wl: Workload) -> tuple[float, int]:
    """(FLOPs of the tower per micro-batch, its rows)."""
    v = facts.vision
    if v is None or not wl.images_per_example or not wl.tower_tokens:
        return 0.0, 0
    images = wl.per_device_batch * wl.images_per_example * max(wl.tower_images, 1)
    rows = images * wl.tower_tokens
    fwd = 2.0 * rows * (v.tower_params + v.projector_params) + 4.0 * v.num_layers * rows * wl.tower_tokens * v.hidden_size
    passes = 1.0
    if wl.train_tower:
        passes += 2.0 + (1.0 if wl.gradient_checkpointing else 0.0)
    return fwd * passes, rows


def tower_terms(facts: ModelFacts, wl: Workload, gpu: GPUProfile, peak_flops: float) -> list[Term]:
    flops, rows = tower_flops(facts, wl)
    if not rows:
        return []
    v = facts.vision
    assert v is not None
    eta = gemm_efficiency(K.constants_for(gpu), rows, v.hidden_size)
    passes = (
        "forward only (frozen)"
        if not wl.train_tower
        else ("forward + backward + recompute" if wl.gradient_checkpointing else "forward + backward")
    )
    return [
        Term(
            NAME,
            "matmuls",
            flops / (eta * peak_flops),
            "micro-batch",
            "device",
            f"2 x {rows:,} rows x {v.tower_params + v.projector_params:,} parameters + attention within each image, {passes}, "
            f"at eta({rows:,} rows) of the peak",
            "Kaplan et al. 2020; estimate/step_time/tower_terms.py",
        )
    ]
