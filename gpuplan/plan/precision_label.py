"""The compute precision a plan trains in, as one short label (gpuplan compare's precision column).

Mixed precision (training.bf16 / training.fp16) names itself. Without it the weights'
dtype is the compute dtype: bf16 weights compute in bf16, which a GPU without native
bf16 (V100, T4: before compute capability 8.0) runs emulated, the plan's "emulated, slow"
warning (plan/rules/precision.py). Only fp32 weights run in TF32 or fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EMULATED = "bf16 (emulated)"


def precision_label(settings: Mapping[str, Any], gpu_has_bf16: bool) -> str:
    """ "bf16", "fp16", "bf16 (emulated)", "tf32" or "fp32" for a plan's settings."""

    def value(key: str) -> Any:
        return settings[key].value

    if value("training.bf16"):
        return "bf16"
    if value("training.fp16"):
        return "fp16"
    dtype = value("model.dtype")
    if dtype == "bfloat16":
        return "bf16" if gpu_has_bf16 else EMULATED
    if dtype == "float16":
        return "fp16"
    return "tf32" if value("training.tf32") else "fp32"
