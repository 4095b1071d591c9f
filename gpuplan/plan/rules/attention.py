"""Attention implementation (guide: "Scaled dot production attention").

sdpa by default. flash_attention_2 needs the flash_attn package, an Ampere+ NVIDIA
GPU and fp16/bf16 compute; otherwise sdpa, whose kernels (flash for 16-bit,
memory-efficient for fp32) also keep attention memory linear in seq_len.
"""

from __future__ import annotations

from gpuplan.plan.context import Resolver
from gpuplan.plan.graph import Rule


def attention(ctx: Resolver) -> None:
    want = ctx.spec("model.attn_implementation")
    gpu = ctx.gpu
    half = ctx.get("training.bf16") or ctx.get("training.fp16") or ctx.spec("model.dtype") != "float32"
    if want == "auto":
        ctx.resolve(
            "model.attn_implementation",
            "sdpa",
            "torch SDPA: fused flash / memory-efficient kernels, attention memory linear in seq_len",
        )
        return
    if want == "flash_attention_2":
        problems = []
        if gpu.vendor != "nvidia" or not gpu.is_ampere_or_newer:
            problems.append(f"needs an Ampere or newer NVIDIA GPU ({gpu.name} is not)")
        if not half:
            problems.append("needs fp16 or bf16 compute (the plan runs in fp32)")
        if not ctx.environment.get("packages", {}).get("flash_attn"):
            problems.append("the flash_attn package is not installed")
        if problems:
            ctx.resolve(
                "model.attn_implementation",
                "sdpa",
                "flash_attention_2 " + "; ".join(problems) + "; SDPA gives the same memory scaling",
            )
            return
    if want == "eager":
        ctx.note("model.attn_implementation", "eager attention keeps batch x heads x seq_len^2 scores per layer",
                 fix='set model.attn_implementation = "sdpa" unless you need attention weights')
    ctx.keep("model.attn_implementation")


RULES = (
    Rule(
        "attention.implementation",
        reads=("spec:model.attn_implementation", "spec:model.dtype", "training.bf16", "training.fp16"),
        writes=("model.attn_implementation",),
        apply=attention,
        doc="sdpa by default; flash_attention_2 only with its package, Ampere+ and 16-bit compute.",
    ),
)
