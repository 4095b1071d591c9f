"""Chunked cross-entropy: the output head and the loss over chunks of tokens.

apply/model/chunked_loss.py runs the head (lm_head) and the cross-entropy over `chunk` tokens at
a time, each chunk under torch.utils.checkpoint (non-reentrant), so its logits, their fp32
copy and log_softmax are freed after its forward and recomputed in backward, one chunk at
a time. The full [tokens, vocab] logits never exist (the technique of torchtune's
CEWithChunkedOutputLoss and of TRL/Liger's fused linear cross-entropy; Wijmans et al. 2024,
"Cut Your Losses in Large-Vocabulary Language Models", section 2, count the same tensors).

Memory (memory/activations.py ActivationParts): the loss path's parts, logits at the end
of forward, 3 fp32 [tokens, vocab] at the start of backward and the logits' gradient, are
counted for min(tokens, chunk) tokens instead of every token of the micro-batch.

Time: each chunk's head forward runs twice, once more in backward: 2 x hidden x vocab
FLOPs per token (a linear layer's forward is 2 FLOPs per weight per token; Kaplan et al.
2020, section 2.1). The softmax and its fp32 copies move the same bytes as unchunked.

Availability: causal-lm models whose CausalLM.forward computes `logits = self.lm_head(h)`
and passes them straight to `self.loss_function(...)` (transformers 5: llama, mistral,
qwen2, qwen3, gemma, mixtral, phi, phi3, gpt2, gpt_neox, opt;
tests/apply/test_chunked_loss.py reads each forward to check it); Gemma 2/3 soft-cap the logits
between the two and are not in the list.
"""

from __future__ import annotations

NAME = "chunked cross-entropy"
KEY = "training.loss_chunk_size"
# Tokens per chunk when the fit search turns it on. 1,024 x hidden >= 1M-element GEMMs keep
# the head matmul on tensor cores' efficient sizes; torchtune splits into 8 chunks, Liger
# into about tokens x hidden / vocab: at 8B (vocab / hidden ~ 31) and 8k tokens both are
# ~256-1,024 tokens.
CHUNK_TOKENS = 1024
FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "mixtral", "phi", "phi3", "gpt2", "gpt_neox", "opt"})


def unavailable(model_type: str, task: str) -> str | None:
    """Why chunked cross-entropy cannot run for this model and task; None when it can."""
    if task != "causal-lm":
        return f"chunked cross-entropy is for causal-lm; model.task is {task!r}"
    if model_type not in FAMILIES:
        return (
            f"{model_type!r}'s CausalLM forward is not one gpuplan has checked computes "
            f"the loss straight from lm_head's logits (checked: {', '.join(sorted(FAMILIES))})"
        )
    return None


def loss_tokens(tokens: int, chunk: int) -> int:
    """Tokens whose logits exist at once: every token, or one chunk."""
    return min(tokens, chunk) if chunk > 0 else tokens


def extra_flops_per_token(hidden_size: int, vocab_size: int) -> int:
    """The head forward recomputed in backward: 2 FLOPs per weight per token."""
    return 2 * hidden_size * vocab_size


def extra_seconds(hidden_size: int, vocab_size: int, tokens_per_step: int, flops_per_second: float) -> float:
    """Seconds per optimizer step the recomputed head adds on one device: its FLOPs over the
    rate the step-time model assumes for the device (dense peak x utilisation)."""
    return extra_flops_per_token(hidden_size, vocab_size) * tokens_per_step / flops_per_second


def cost_fraction(hidden_size: int, vocab_size: int, flops_per_token: float) -> float:
    """The slowdown as a fraction of the step's FLOPs (orders the fit search's savers)."""
    return extra_flops_per_token(hidden_size, vocab_size) / max(flops_per_token, 1.0)


def cost_wording(hidden_size: int, vocab_size: int, flops_per_token: float) -> str:
    frac = cost_fraction(hidden_size, vocab_size, flops_per_token)
    return (
        f"about {frac:.0%} slower: the output head's forward runs once more per chunk in backward "
        f"(2 x {hidden_size:,} x {vocab_size:,} FLOPs per token)"
    )
