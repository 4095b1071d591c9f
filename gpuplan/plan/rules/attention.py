"""Attention implementation (guide: "Scaled dot production attention").

sdpa by default, where the model family supports it: transformers raises for a kernel
a family does not declare (`_supports_sdpa = False` on Gemma-2 in 5.24, for its logit
softcapping), so each family's support is read from gpuplan/modelinfo/attention_support.json
(generated from the installed transformers). flash_attention_2 needs the flash_attn
package, fp16/bf16 compute and a GPU it has kernels for: NVIDIA Ampere or newer, or AMD
Instinct MI200/MI300 through flash-attn's ROCm backend (Dao-AILab/flash-attention README,
"AMD ROCm Support"; transformers accepts HIP builds). Otherwise the next kernel the family
supports: sdpa (linear attention memory), else eager.
"""

from __future__ import annotations

from gpuplan.modelinfo.attention import attention_support, support_source
from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.inputs.target import install_note, is_local, target_packages


def _flash_problems(ctx: Resolver, half: bool) -> list[str]:
    gpu = ctx.gpu
    problems = []
    if gpu.vendor == "amd":
        if not gpu.bf16:  # CDNA2 (MI200) and newer have bf16; flash-attn's ROCm kernels need CDNA2+
            problems.append(f"needs an AMD Instinct MI200 or newer on ROCm ({gpu.name} is not)")
    elif gpu.vendor != "nvidia" or not gpu.is_ampere_or_newer:
        problems.append(f"needs an Ampere or newer NVIDIA GPU, or an AMD Instinct MI200/MI300 ({gpu.name} is neither)")
    if not half:
        problems.append("needs fp16 or bf16 compute (the plan runs in fp32)")
    if not target_packages(ctx.spec, ctx.environment).get("flash_attn"):
        problems.append("the flash_attn package is not installed")
    return problems


def attention(ctx: Resolver) -> None:
    want = ctx.spec("model.attn_implementation")
    half = ctx.get("training.bf16") or ctx.get("training.fp16") or ctx.spec("model.dtype") != "float32"
    support = attention_support(ctx.facts.model_type) or {"sdpa": True, "flash_attention_2": True}
    family = ctx.facts.model_type
    sdpa_ok = support["sdpa"]
    no_sdpa = f"{family} does not support SDPA in {support_source()} (_supports_sdpa = False)"
    fallback = "sdpa" if sdpa_ok else "eager"
    if want == "auto":
        if sdpa_ok:
            ctx.resolve(
                "model.attn_implementation",
                "sdpa",
                "torch SDPA: fused flash / memory-efficient kernels, attention memory linear in seq_len",
            )
        else:
            ctx.resolve("model.attn_implementation", "eager", f"{no_sdpa}: eager attention, batch x heads x seq_len^2 scores per layer")
        return
    if want == "sdpa" and not sdpa_ok:
        ctx.resolve("model.attn_implementation", "eager", f"{no_sdpa}; transformers would raise: eager attention instead")
        return
    if want == "flash_attention_2":
        problems = [] if support["flash_attention_2"] else [f"{family} does not support it in {support_source()}"]
        problems += _flash_problems(ctx, half)
        if problems:
            tail = "; SDPA gives the same memory scaling" if sdpa_ok else f"; {no_sdpa}: eager attention"
            ctx.resolve("model.attn_implementation", fallback, "flash_attention_2 " + "; ".join(problems) + tail)
            return
        if not is_local(ctx.spec):
            install_note(ctx, "model.attn_implementation", "flash_attn", "flash_attention_2")
    if want == "eager":
        ctx.note(
            "model.attn_implementation",
            "eager attention keeps batch x heads x seq_len^2 scores per layer",
            fix='set model.attn_implementation = "sdpa" unless you need attention weights' if sdpa_ok else None,
        )
    ctx.keep("model.attn_implementation")


RULES = (
    Rule(
        "attention.implementation",
        reads=(
            "spec:model.attn_implementation",
            "spec:model.dtype",
            "training.bf16",
            "training.fp16",
            "spec:hardware.gpu",
            "spec:hardware.nodes",
        ),
        writes=("model.attn_implementation",),
        apply=attention,
        doc="sdpa where the family supports it; flash_attention_2 only with its package, a GPU it supports and 16-bit compute.",
    ),
)
