"""Mixed precision and TF32 (guide: "Mixed precision"; peers: reference/peer-rules.md).

- fp16 and bf16 both on: error (TrainingArguments refuses it too).
- bf16 on hardware without bf16 becomes fp16 (error under --strict).
- auto: bf16 on Ampere and newer, fp16 before, none on CPU.
- tf32 only on Ampere and newer NVIDIA GPUs; auto follows the GPU.
- Pure fp16 weights are not trainable with the Trainer's GradScaler ("Attempting to
  unscale FP16 gradients"): refused, as torchtune does, where a trained weight would be
  fp16 (full fine-tuning, LoRA's modules_to_save copies); a frozen fp16 LoRA/QLoRA base
  with fp32 adapters is the standard T4/V100 recipe and is planned.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.wording import bf16_capability


def mixed_precision(ctx: Resolver) -> None:
    gpu = ctx.gpu
    bf16, fp16 = ctx.spec("training.bf16"), ctx.spec("training.fp16")
    dtype = ctx.spec("model.dtype")
    cpu = gpu.is_cpu
    if bf16 is True and fp16 is True:
        ctx.error(
            "training.bf16",
            "training.fp16 and training.bf16 are both true; choose one",
            fix="set training.fp16 = false (bf16 on Ampere and newer) or training.bf16 = false",
        )
        ctx.keep("training.bf16")
        ctx.keep("training.fp16")
        return
    if dtype == "float16":
        fp16_trained_weights(ctx)

    # bf16: as asked where the hardware has it (CPU autocast has bf16), else off; fp16
    # weights (a frozen LoRA base) are run under fp16 autocast, not bf16.
    bf16_missing = bf16 is True and not gpu.bf16 and not cpu
    if bf16 == "auto":
        new_bf16 = not cpu and gpu.bf16 and fp16 is not True and dtype != "float16"
    else:
        new_bf16 = bool(bf16) and not bf16_missing

    # fp16: as asked; auto means mixed precision on a GPU when bf16 is not used;
    # bf16 asked on a GPU without it falls back to fp16 unless fp16 = false.
    if fp16 == "auto":
        new_fp16 = not cpu and not new_bf16 and dtype in ("float32", "float16")
    else:
        new_fp16 = bool(fp16)
    if bf16_missing and fp16 is not False:
        new_fp16 = True
    if new_fp16 and dtype == "bfloat16":
        ctx.error(
            "training.fp16",
            'training.fp16 = true with model.dtype = "bfloat16": fp16 autocast over bf16 weights',
            fix="set training.fp16 = false (the weights are already bf16)",
        )
        new_fp16 = False

    ctx.resolve("training.bf16", new_bf16, _bf16_reason(ctx, new_bf16))
    if new_fp16 and cpu:
        ctx.resolve(
            "training.fp16", False, "CPU training has no fp16 mixed precision (the Trainer's GradScaler needs CUDA); planned in fp32"
        )
    else:
        ctx.resolve("training.fp16", new_fp16, _fp16_reason(ctx, new_fp16))
    if bf16_missing and fp16 is False:
        ctx.warn(
            "training.bf16",
            f"{gpu.name} has no bf16 and training.fp16 = false: training runs in fp32",
            fix="set training.fp16 = true for mixed precision",
        )
    if dtype == "bfloat16" and not gpu.bf16 and not cpu:
        ctx.warn(
            "model.dtype",
            f'model.dtype = "bfloat16" on {gpu.name}, which has no native bf16: emulated, slow',
            fix=_no_bf16_dtype_fix(ctx),
        )


def _no_bf16_dtype_fix(ctx: Resolver) -> str:
    """The dtype to load in on a GPU without bf16. A frozen adapter base goes to float16, the dtype
    fp16 autocast computes in (float32 would double its weights); fp16_trained_weights below says
    where a LoRA base cannot be fp16 (full fp16 copies trained beside the adapters), and full
    fine-tuning trains its weights, so those keep fp32 master weights under AMP."""
    method = ctx.spec("model.method") or "full"
    copies = ctx.spec("lora.modules_to_save") or ctx.spec("model.task") == "seq-cls"
    if method == "qlora" or (method == "lora" and not copies):
        return f'set model.dtype = "float16": the frozen {method} base in the dtype fp16 mixed precision computes in'
    return 'set model.dtype = "float32" and let gpuplan pick fp16'


def fp16_trained_weights(ctx: Resolver) -> None:
    """model.dtype = "float16" is refused where a trained weight would be fp16.

    Full fine-tuning trains the fp16 weights themselves; LoRA trains its adapters in fp32
    (peft 0.21 get_peft_model(autocast_adapter_dtype=True) upcasts fp16/bf16 adapter
    weights), but lora.modules_to_save and a seq-cls head are trained as fp16 copies of the
    base modules (ModulesToSaveWrapper). QLoRA's prepare_model_for_kbit_training casts every
    non-4-bit parameter to fp32 before peft copies them, so it trains nothing in fp16.
    """
    method = ctx.spec("model.method") or "full"
    scaler = "the Trainer's GradScaler cannot unscale fp16 gradients and fp16 master weights lose small updates"
    if method == "full":
        ctx.error(
            "model.dtype",
            f'model.dtype = "float16": pure fp16 full fine-tuning is refused ({scaler})',
            fix='set model.dtype = "float32" with training.fp16 = true (AMP), or model.dtype = "bfloat16"',
        )
        return
    if method == "auto":  # resolved later, from the memory fit: it may pick full fine-tuning
        ctx.error(
            "model.dtype",
            f'model.dtype = "float16" with model.method = "auto": full fine-tuning, one of the '
            f"methods it may pick, cannot train fp16 weights ({scaler})",
            fix='set model.method = "lora" or "qlora" (fp32 adapters over the fp16 base), or model.dtype = "float32"',
        )
        return
    copies = list(ctx.spec("lora.modules_to_save") or [])
    if ctx.spec("model.task") == "seq-cls":
        copies.append("the seq-cls head")
    if method == "lora" and copies:
        ctx.error(
            "model.dtype",
            f'model.dtype = "float16" with LoRA: peft trains full fp16 copies of {", ".join(copies)} beside the fp32 adapters ({scaler})',
            fix='set model.method = "qlora" (its non-4-bit modules train in fp32), model.dtype = "bfloat16" '
            'on a GPU with bf16, or model.dtype = "float32"',
        )


def _bf16_reason(ctx: Resolver, value: bool) -> str:
    gpu = ctx.gpu
    if value:
        return f"{gpu.name} supports bf16 ({bf16_capability(gpu)}): bf16 mixed precision, no loss scaling needed"
    if gpu.is_cpu:
        return "CPU: no mixed precision by default (fp32)"
    if ctx.spec("training.bf16") is True:
        if ctx.spec("training.fp16") is False:
            return f"{gpu.name} has no bf16 support (needs {bf16_capability(gpu)}) and training.fp16 = false: the run is fp32"
        return f"{gpu.name} has no bf16 support (needs {bf16_capability(gpu)}): fp16 mixed precision instead"
    if ctx.spec("training.fp16") is True:
        return "training.fp16 = true was asked for; bf16 stays off"
    if ctx.spec("model.dtype") == "float16":
        return 'model.dtype = "float16": the fp16 weights run under fp16 autocast, not bf16'
    return f"{gpu.name} has no bf16 support (needs {bf16_capability(gpu)})"


def _fp16_reason(ctx: Resolver, value: bool) -> str:
    gpu = ctx.gpu
    if value:
        if ctx.spec("training.bf16") is True:
            return f"{gpu.name} has no bf16: fp16 mixed precision (with loss scaling) replaces it"
        if ctx.spec("model.dtype") == "float16":
            return (
                'model.dtype = "float16": fp16 autocast over the frozen fp16 base, with loss scaling of the '
                "adapters' fp32 gradients (peft keeps the adapters in fp32)"
            )
        return f"{gpu.name} predates bf16: fp16 mixed precision with loss scaling"
    if gpu.is_cpu:
        return "CPU: no fp16 mixed precision"
    if ctx.get_or_none("training.bf16"):
        return "bf16 mixed precision is used instead"
    return "fp16 stays off"


def tf32(ctx: Resolver) -> None:
    gpu = ctx.gpu
    want = ctx.spec("training.tf32")
    supported = gpu.tf32 and gpu.vendor == "nvidia"
    if want == "auto":
        if supported:
            why = f"{gpu.name} has TF32 tensor cores (Ampere and newer): fp32 matmuls run in TF32"
            if ctx.spec("training.torch_compile") is True:
                why += "; torch.compile is on, which TrainingArguments pairs with TF32 where supported"
            ctx.resolve("training.tf32", True, why)
        else:
            ctx.resolve("training.tf32", False, _no_tf32(gpu))
    elif want is True and not supported:
        ctx.resolve("training.tf32", False, _no_tf32(gpu) + "; TrainingArguments would raise")
    else:
        ctx.keep("training.tf32")


def _no_tf32(gpu) -> str:
    if gpu.vendor == "amd":
        # transformers' is_torch_tf32_available needs torch.version.cuda: a ROCm build has none
        return f"{gpu.name}: TrainingArguments' tf32 switch needs a CUDA build of torch, not ROCm"
    device = "the CPU" if gpu.is_cpu else gpu.name
    return f"{device} has no TF32 (needs an NVIDIA GPU of compute capability >= 8.0)"


RULES = (
    Rule(
        "precision.mixed",
        reads=(
            "spec:training.bf16",
            "spec:training.fp16",
            "spec:model.dtype",
            "spec:model.method",
            "spec:lora.modules_to_save",
            "spec:model.task",
        ),
        writes=("training.bf16", "training.fp16"),
        apply=mixed_precision,
        doc="fp16/bf16 exclusive; bf16 needs Ampere+ (else fp16); auto by GPU generation; none on CPU.",
    ),
    Rule(
        "precision.tf32",
        reads=("spec:training.tf32", "spec:training.torch_compile"),
        writes=("training.tf32",),
        apply=tf32,
        doc="TF32 only on Ampere+ NVIDIA GPUs; auto follows the GPU.",
    ),
)
