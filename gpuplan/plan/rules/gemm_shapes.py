"""GEMM shapes the spec fixes: vocabulary and padded length (issue 11 item 12).

NVIDIA "Matrix Multiplication Background" / "Tensor Core Requirements": 16-bit GEMM
dimensions in multiples of 8 (64 on A100, the HF guide). The batch side is planned in
memory.fit (batch x seq_len tokens, plan/solve.py batch_multiple). Two other dimensions
belong to the model and the data, so the plan suggests rather than changes them:
- the vocabulary is the output head's GEMM dimension: GPT-2's 50257 is padded to 50304
  (a multiple of 64) by nanoGPT and Megatron-LM; transformers offers
  `model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)`;
- padded data (no packing): apply pads every example to data.seq_len
  (tokenizer(..., padding="max_length"), apply/data.py), which is what a collator's
  pad_to_multiple_of would otherwise do; seq_len is an attention GEMM dimension.
"""

from __future__ import annotations

from gpuplan.plan.context import Resolver
from gpuplan.plan.graph import Rule
from gpuplan.plan.solve import tensor_core_multiple
from gpuplan.plan.wording import matrix_units

VOCAB_PAD = 64  # a multiple of 64 is one of 8 too: right on every GPU


def gemm_shapes(ctx: Resolver) -> None:
    gpu, facts = ctx.gpu, ctx.facts
    half = bool(ctx.get("training.bf16") or ctx.get("training.fp16") or ctx.spec("model.dtype") != "float32")
    g = tensor_core_multiple(gpu, half, ctx.get("training.tf32"))
    if g <= 1:
        return
    cores = matrix_units(gpu)
    vocab = facts.vocab_size
    if ctx.spec("model.task") in ("causal-lm", "masked-lm") and vocab % g:
        padded = -(-vocab // VOCAB_PAD) * VOCAB_PAD
        rows = padded - vocab
        extra = rows * facts.hidden_size * (1 if facts.tie_word_embeddings else 2)
        ctx.note("model.config", f"vocab_size {vocab:,} is not a multiple of {g}: the output head's GEMM misses the "
                 f"{cores}' preferred shape on every step",
                 detail=f"padding to {padded:,} adds {rows} rows ({extra:,} parameters, "
                        f"{extra / facts.n_params:.2%} of the model); the saved model's vocab_size becomes {padded:,} "
                        "(the tokenizer never produces the new ids); gpuplan does not resize for you",
                 fix=f"before training: model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of={VOCAB_PAD})")
    seq = ctx.spec("data.seq_len")
    if ctx.get("data.packing") is False and seq % g:
        up = -(-seq // g) * g
        ctx.note("data.seq_len", f"examples are padded to data.seq_len = {seq}, not a multiple of {g} ({cores}): "
                 "the padded length is an attention GEMM dimension",
                 fix=f"set data.seq_len = {up} (apply pads to seq_len, as a collator's pad_to_multiple_of would)")


RULES = (
    Rule("batch.gemm_shapes", reads=("training.bf16", "training.fp16", "training.tf32", "data.packing",
                                     "spec:model.dtype", "spec:model.task", "spec:data.seq_len"),
         writes=(), apply=gemm_shapes,
         doc="suggest a vocabulary and padded length in multiples of the tensor-core shape."),
)
