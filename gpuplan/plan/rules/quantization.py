"""quantization.compute_dtype: the 4-bit compute dtype of a QLoRA base.

auto -> bfloat16 where the GPU has it, else float16 (bitsandbytes dequantizes to this
dtype for every matmul); on the CPU bfloat16: bitsandbytes' CPU backend dequantizes to
bf16/fp32 only, and fp16 matmuls have no fast CPU kernels. bfloat16 asked on a GPU
without it becomes float16.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.rules.common import QUANT_COMPUTE


def compute_dtype(ctx: Resolver) -> None:
    gpu = ctx.gpu
    asked = ctx.spec("quantization.bnb_4bit_compute_dtype")
    cpu = gpu.is_cpu
    ctx.set_internal(QUANT_COMPUTE, _compute_dtype(gpu, asked))
    if ctx.spec("model.method") not in ("qlora", "auto"):
        ctx.keep("quantization.bnb_4bit_compute_dtype")  # no 4-bit base: nothing to resolve
        return
    if asked == "auto":
        if cpu:
            ctx.resolve(
                "quantization.bnb_4bit_compute_dtype",
                "bfloat16",
                "CPU: bitsandbytes' CPU backend dequantizes 4-bit weights to bfloat16 (fp16 has no fast CPU matmul)",
            )
        elif gpu.bf16:
            ctx.resolve(
                "quantization.bnb_4bit_compute_dtype",
                "bfloat16",
                f"{gpu.name} has bf16: 4-bit weights dequantize to bfloat16 for each matmul",
            )
        else:
            ctx.resolve(
                "quantization.bnb_4bit_compute_dtype",
                "float16",
                f"{gpu.name} has no bf16 (compute capability < 8.0): 4-bit weights dequantize to float16",
            )
    elif asked == "bfloat16" and not gpu.bf16 and not cpu:
        ctx.resolve(
            "quantization.bnb_4bit_compute_dtype",
            "float16",
            f"{gpu.name} has no bf16 (compute capability < 8.0): 4-bit matmuls compute in float16",
        )
    else:
        ctx.keep("quantization.bnb_4bit_compute_dtype")


def _compute_dtype(gpu, asked: str) -> str:
    if asked == "auto":
        return "bfloat16" if gpu.is_cpu or gpu.bf16 else "float16"
    if asked == "bfloat16" and not gpu.bf16 and not gpu.is_cpu:
        return "float16"
    return asked


RULES = (
    Rule(
        "quantization.compute_dtype",
        reads=("spec:quantization.bnb_4bit_compute_dtype", "spec:model.method"),
        writes=("quantization.bnb_4bit_compute_dtype", QUANT_COMPUTE),
        apply=compute_dtype,
        doc="4-bit compute dtype: bf16 where the GPU has it, else fp16; bf16 on CPU.",
    ),
)
