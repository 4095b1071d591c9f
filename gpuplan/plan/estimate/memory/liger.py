"""Liger kernels (TrainingArguments.use_liger_kernel, the liger-kernel package): where they run,
and what their fused linear cross-entropy leaves of the loss path.

Where: Liger's kernels are Triton, so a CUDA or ROCm GPU (liger-kernel 0.8.5 README,
"Dependencies": CUDA torch >= 2.1.2 + triton >= 2.3.1, ROCm torch >= 2.5 + triton >= 3.0).
AMD GPUs of the architectures its utils.py `_AMD_ARCH_BY_GFX` maps (CDNA 1-3, RDNA 3);
model types of its transformers/monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN, which the
Trainer's apply_liger_kernel (transformers integrations/liger.py) dispatches on.

Memory (liger_kernel/ops/fused_linear_cross_entropy.py, fused_linear_cross_entropy_forward):
the head matmul and the loss run in forward over chunks of
chunk = next_pow2(ceil(BT / ceil(V / H))) tokens (clamped to BT), each chunk's logits buffer
[chunk, V] in the input dtype reused and overwritten in place by its gradient; grad_input
[BT, H] and, when the head trains, grad_weight [V, H] are filled in forward and held until
backward, which only scales them. So: at the end of forward chunk x V + BT x H (+ V x H)
elements, at the start of backward BT x H (+ V x H), no logits gradient after the head.
RMSNorm (saves X and rstd), SwiGLU (saves gate and up, recomputes SiLU) and RoPE change the
per-layer activations too; those Triton kernels cannot run on CPU or fake tensors, so gpuplan
does not count their savings (the estimate is an upper bound there).

Speed: the fused loss does the head's forward and backward matmuls once, in forward (no
recomputation); Hsu et al. 2024 ("Liger Kernel: Efficient Triton Kernels for LLM Training",
section 4) report ~20% more end-to-end throughput. The step-time model does not count it.
"""

from __future__ import annotations

NAME = "Liger kernels"
KEY = "training.use_liger_kernel"
# liger-kernel 0.8.5 transformers/monkey_patch.py MODEL_TYPE_TO_APPLY_LIGER_FN, the model types
# gpuplan plans (tests/plan/test_savers_plan.py checks each against the installed package)
FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"})
# AMD catalog GPUs -> gfx target (AMD ROCm docs, "GPU hardware specifications"); liger utils.py
# _AMD_ARCH_BY_GFX knows gfx908 (CDNA), gfx90a (CDNA 2), gfx940-942 (CDNA 3), gfx1100-1102 (RDNA 3)
AMD_GFX = {"MI250X": "gfx90a", "MI300X": "gfx942", "MI325X": "gfx942"}
LIGER_GFX = frozenset({"gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx1100", "gfx1101", "gfx1102"})


def unavailable(model_type: str, task: str, vendor: str, gpu_name: str) -> str | None:
    """Why Liger's kernels cannot run here; None when they can."""
    if vendor == "cpu":
        return "Liger's kernels are Triton GPU kernels: they do not run on a CPU"
    if vendor == "amd" and AMD_GFX.get(gpu_name) not in LIGER_GFX:
        return f"{gpu_name} is not an AMD architecture liger-kernel 0.8.5 supports (CDNA 1-3, RDNA 3)"
    if vendor not in ("nvidia", "amd"):
        return f"Liger's kernels run on CUDA and ROCm GPUs, not on {vendor}"
    if task != "causal-lm":
        return f"Liger patches causal language models; model.task is {task!r}"
    if model_type not in FAMILIES:
        return (
            f"liger-kernel does not patch model_type {model_type!r} "
            f"(it patches, of the families gpuplan plans: {', '.join(sorted(FAMILIES))})"
        )
    return None


def flce_chunk(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's chunk of tokens: next_pow2(ceil(BT / ceil(V / H))), at most BT."""
    inc = -(-vocab // hidden)
    per = -(-tokens // inc)
    return min(1 << max(per - 1, 0).bit_length(), tokens) if per > 0 else 0


def flce_bytes(tokens: int, hidden: int, vocab: int, act_bytes: int, head_grad_bytes: int) -> tuple[int, int]:
    """(end of forward, start of backward) bytes of the fused loss; head_grad_bytes = 0 when the
    head is frozen (adapters), else its dtype's bytes per weight."""
    held = tokens * hidden * act_bytes + vocab * hidden * head_grad_bytes + 4 * tokens  # + fp32 loss_1d
    return flce_chunk(tokens, hidden, vocab) * vocab * act_bytes + held, held


def speedup_note() -> str:
    return "Liger kernels: the step time does not count their speed-up (Hsu et al. 2024 report ~20% more end-to-end throughput)"
