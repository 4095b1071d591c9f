"""model.dtype of a frozen base: what LoRA and QLoRA load the base weights in.

- lora: a frozen base needs no fp32 master weights (nothing updates it; only the fp32
  adapters train, peft's autocast_adapter_dtype), so unless the spec sets model.dtype
  the base loads in bfloat16 where the run computes in bf16 (training.bf16 on a GPU with
  bf16): half the weight bytes of fp32, and the dtype its matmuls run in under autocast
  anyway. Without bf16 (T4, V100, the CPU) the base stays float32: an fp16 base is not
  planned there (rules/precision.py).
- qlora: the base loads in the 4-bit compute dtype (quantization.bnb_4bit_compute_dtype),
  so bitsandbytes' QuantState.dtype is the compute dtype and MatMul4Bit's backward
  dequantizes straight to it (bitsandbytes autograd/_functions.py; loaded in fp32 it
  dequantizes to fp32, then casts: 3x the transient). prepare_model_for_kbit_training
  casts every unquantized 16-bit parameter to fp32 afterwards (peft utils/other.py), so
  the memory of the rest is the same either way.
"""

from __future__ import annotations

from gpuplan.plan.engine.resolver import Resolver
from gpuplan.units import GIB


def frozen_base_dtype(ctx: Resolver, method: str, bf16: bool, compute: str) -> tuple[str, str | None]:
    """(model.dtype for `method`, the reason when it differs from the spec's)."""
    asked = ctx.spec("model.dtype")
    if method == "full" or ctx.is_user("model.dtype"):
        return asked, None
    if method == "qlora":
        return compute, (
            f"qlora: the base loads in the 4-bit compute dtype ({compute}), so bitsandbytes dequantizes "
            "straight to it; prepare_model_for_kbit_training then casts the unquantized parts "
            "(embeddings, norms, head) to fp32"
        )
    if bf16 and not ctx.gpu.is_cpu and asked == "float32":
        saved = 2 * ctx.facts.n_params / GIB
        return "bfloat16", (
            f"lora: the frozen base needs no fp32 master weights (only the fp32 adapters train), so it "
            f"loads in bfloat16, the dtype bf16 mixed precision computes in: {saved:.1f} GiB less "
            "than fp32"
        )
    return asked, None
