"""Batch split (guide: "Batch size", "Gradient accumulation").

Writes what memory.fit chose, with the reason for each value: the per-device batch
(tensor-core multiple where memory allows), the accumulation that holds the
effective batch, and the effective batch itself when it was derived.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.fit.search import FitProblem, FitSolution, price, tensor_core_multiple
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION, TRAINER_DEFAULT_BATCH, world_size
from gpuplan.plan.wording import matrix_units
from gpuplan.spec.objectives import objective
from gpuplan.units import GIB

KEYS = (
    "training.effective_batch_size",
    "training.per_device_train_batch_size",
    "training.gradient_accumulation_steps",
    "training.per_device_eval_batch_size",
)


def split(ctx: Resolver) -> None:
    sol, p = ctx.get(FIT_SOLUTION), ctx.get(FIT_PROBLEM)
    if sol is None or p is None:
        for k in KEYS:
            ctx.keep(k)
        return
    world = world_size(ctx)
    _resolve_effective_batch(ctx, sol, world)
    _resolve_train_batch(ctx, p, sol, world)
    _note_batch_off_multiple(ctx, p, sol, world)
    _resolve_accumulation(ctx, sol, world)
    _resolve_eval_batch(ctx, sol.per_device_batch)


def _tokens_per_example(p: FitProblem) -> int:
    """The tokens one example puts through the GEMMs: seq_len, times the sequences the objective scores."""
    seq = p.base.seq_len
    seq *= objective(p.base.objective).grad_sequences  # dpo: an example is chosen + rejected, 2 x seq_len tokens
    return seq


def _resolve_effective_batch(ctx: Resolver, sol: FitSolution, world: int) -> None:
    """training.effective_batch_size: derived from the split when the spec gives none, with why."""
    b, a = sol.per_device_batch, sol.accumulation
    e = b * a * world
    if ctx.spec("training.effective_batch_size") is None:
        if ctx.is_user("training.per_device_train_batch_size"):
            why = (
                f"per_device_train_batch_size x gradient_accumulation_steps x "
                f"{'GPUs' if not ctx.gpu.is_cpu else 'CPU processes'} = {b} x {a} x {world}"
            )
        else:
            why = f"no effective_batch_size given: the Trainer's default of {TRAINER_DEFAULT_BATCH} per device x {world} device(s)"
            ctx.note(
                "training.effective_batch_size",
                f"effective batch {e} is the Trainer default, not a choice",
                fix="set training.effective_batch_size to what your recipe needs; gpuplan then picks the split",
            )
        ctx.resolve("training.effective_batch_size", e, why)
    else:
        ctx.keep("training.effective_batch_size")


def _resolve_train_batch(ctx: Resolver, p: FitProblem, sol: FitSolution, world: int) -> None:
    """training.per_device_train_batch_size: the fit's batch, and why it is (or replaces) the spec's."""
    b = sol.per_device_batch
    s = b * sol.accumulation
    usable = p.usable_bytes / GIB
    user_b = ctx.spec("training.per_device_train_batch_size")
    g, seq = p.gemm_multiple, _tokens_per_example(p)
    cores = matrix_units(ctx.gpu)
    if user_b != "auto" and user_b != b:
        why, rule = _why_batch_moved(ctx, p, sol, user_b, world)
        ctx.resolve("training.per_device_train_batch_size", b, why, rule=rule)
    elif user_b == "auto":
        tail = f"; {b} x {seq} = {b * seq:,} tokens per micro-batch, a multiple of {g} for {cores}" if g > 1 and (b * seq) % g == 0 else ""
        ctx.resolve(
            "training.per_device_train_batch_size",
            b,
            f"largest per-device batch that fits in {usable:.1f} GiB and divides {s} samples per device{tail}",
            rule="batch.fit",
        )
    else:
        ctx.keep("training.per_device_train_batch_size")


def _why_batch_moved(ctx: Resolver, p: FitProblem, sol: FitSolution, user_b: int, world: int) -> tuple[str, str]:
    """(reason, rule id) for replacing the spec's per-device batch: it does not divide, does not fit, or misses the GEMM multiple."""
    b, a = sol.per_device_batch, sol.accumulation
    e = b * a * world
    usable = p.usable_bytes / GIB
    g, seq, s = p.gemm_multiple, _tokens_per_example(p), b * a
    cores = matrix_units(ctx.gpu)
    user_need = price(p, user_b, sol.knobs).reserved_peak_bytes
    if s % user_b:
        return (
            f"{user_b} per device does not divide the {s} samples per device per step "
            f"(effective batch {e} / {world} device(s)); {b} is the nearest batch that does and fits",
            "batch.fit",
        )
    elif user_need > p.usable_bytes:
        return (
            f"{user_b} per device needs {user_need / GIB:.1f} GiB, more than the {usable:.1f} GiB usable; "
            f"{b} is the nearest batch that fits",
            "batch.fit",
        )
    else:  # it divides and fits: moved for the GEMM shape (solve._choose)
        return (
            f"{cores}: {ctx.gpu.name} runs {_dtype(ctx)} GEMMs best with dimensions in multiples of {g} "
            f"({_multiple_source(g, ctx.gpu.vendor)}); the batch enters them as batch x seq_len tokens: "
            f"{user_b} x {seq} = {user_b * seq:,} is not a multiple of {g}, {b} x {seq} = {b * seq:,} is; "
            f"{b} is the nearest such batch that fits and divides the {s} samples per device",
            "batch.tensor_core_multiple",
        )


def _note_batch_off_multiple(ctx: Resolver, p: FitProblem, sol: FitSolution, world: int) -> None:
    """A note when the fitting batch is off the tensor-core multiple: memory or the per-device samples keep it there."""
    b = sol.per_device_batch
    m = p.tensor_multiple
    g, seq, s = p.gemm_multiple, _tokens_per_example(p), b * sol.accumulation
    cores = matrix_units(ctx.gpu)
    if not sol.on_tensor_multiple and m > 1 and sol.fits:
        tokens = f"{b} x {seq} = {b * seq:,} tokens per micro-batch is not a multiple of {g} ({cores})"
        if s % m == 0:  # a batch multiple divides the per-device samples: memory is the limit
            ctx.note(
                "training.per_device_train_batch_size",
                f"{tokens}: {m} per device does not fit",
                fix='more GPUs or memory savers (set them to "auto") make room for a multiple',
            )
        else:
            ctx.note(
                "training.per_device_train_batch_size",
                f"{tokens}: no batch that makes it one divides the {s} samples per device",
                fix=f"an effective batch divisible by {m * world} lets gpuplan use a multiple of {m} per device",
            )


def _resolve_accumulation(ctx: Resolver, sol: FitSolution, world: int) -> None:
    """training.gradient_accumulation_steps: the steps that hold the effective batch, with why."""
    b, a = sol.per_device_batch, sol.accumulation
    e = b * a * world
    where = f"{world} GPU(s)" if not ctx.gpu.is_cpu else "the CPU"
    if ctx.spec("training.gradient_accumulation_steps") == "auto":
        why = (
            f"holds the effective batch: {e} = {b} per device x {a} step(s) x {where}"
            if a > 1
            else f"the effective batch {e} fits in one pass per device: no accumulation (the guide: many steps slow training)"
        )
        ctx.resolve("training.gradient_accumulation_steps", a, why, rule="batch.split")
    elif ctx.spec("training.gradient_accumulation_steps") != a:
        ctx.resolve("training.gradient_accumulation_steps", a, f"holds the effective batch {e} at {b} per device", rule="batch.split")
    else:
        ctx.keep("training.gradient_accumulation_steps")


def _resolve_eval_batch(ctx: Resolver, b: int) -> None:
    """training.per_device_eval_batch_size: the train batch when "auto"."""
    if ctx.spec("training.per_device_eval_batch_size") == "auto":
        ctx.resolve("training.per_device_eval_batch_size", b, "same as the train batch: evaluation keeps no gradients or optimizer states")
    else:
        ctx.keep("training.per_device_eval_batch_size")


def _multiple_source(g: int, vendor: str) -> str:
    if vendor == "amd":
        return f"NVIDIA's matmul-guide multiple of {g}, applied to AMD matrix cores as a default"
    if g == 64:
        return "64 on A100 for fp16/bf16, the HF guide; 8 on other GPUs, the NVIDIA matmul guide"
    if g == 8:
        return "NVIDIA matmul guide: 8 for fp16/bf16; 64 on A100"
    return "NVIDIA matmul guide: 4 for TF32"


def _dtype(ctx: Resolver) -> str:
    if ctx.get("training.bf16"):
        return "bf16"
    if ctx.get("training.fp16"):
        return "fp16"
    return "TF32"


# GEMM shapes the spec fixes (issue 11 item 12): the vocabulary and the padded length.
# NVIDIA "Matrix Multiplication Background" / "Tensor Core Requirements": 16-bit GEMM
# dimensions in multiples of 8 (64 on A100, the HF guide). The batch side is planned in
# memory.fit (batch x seq_len tokens, plan/fit/search.py batch_multiple). Two other dimensions
# belong to the model and the data, so the plan suggests rather than changes them:
# - the vocabulary is the output head's GEMM dimension: GPT-2's 50257 is padded to 50304
#   (a multiple of 64) by nanoGPT and Megatron-LM; transformers offers
#   `model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)`;
# - padded data (no packing): apply pads every example to data.seq_len
#   (tokenizer(..., padding="max_length"), apply/data/prepare.py), which is what a collator's
#   pad_to_multiple_of would otherwise do; seq_len is an attention GEMM dimension.

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
        ctx.note(
            "model.config",
            f"vocab_size {vocab:,} is not a multiple of {g}: the output head's GEMM misses the {cores}' preferred shape on every step",
            detail=f"padding to {padded:,} adds {rows} rows ({extra:,} parameters, "
            f"{extra / facts.n_params:.2%} of the model); the saved model's vocab_size becomes {padded:,} "
            "(the tokenizer never produces the new ids); gpuplan does not resize for you",
            fix=f"before training: model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of={VOCAB_PAD})",
        )
    seq = ctx.spec("data.seq_len")
    # dpo / kto: TRL pads each batch to its longest sequence, not to data.seq_len: no padded length to suggest
    if ctx.get("data.packing") is False and seq % g and ctx.spec("training.objective") == "sft":
        up = -(-seq // g) * g
        ctx.note(
            "data.seq_len",
            f"examples are padded to data.seq_len = {seq}, not a multiple of {g} ({cores}): "
            "the padded length is an attention GEMM dimension",
            fix=f"set data.seq_len = {up} (apply pads to seq_len, as a collator's pad_to_multiple_of would)",
        )


RULES = (
    Rule(
        "batch.split",
        reads=(
            FIT_SOLUTION,
            FIT_PROBLEM,
            "training.bf16",
            "training.fp16",
            "spec:training.effective_batch_size",
            "spec:training.per_device_train_batch_size",
            "spec:training.gradient_accumulation_steps",
            "spec:training.per_device_eval_batch_size",
            "spec:hardware.count",
            "spec:hardware.nodes",
        ),
        writes=KEYS,
        apply=split,
        explains=("batch.tensor_core_multiple", "batch.fit"),
        doc="effective = per-device x accumulation x GPUs; tensor-core multiples; accumulation kept small.",
    ),
    Rule(
        "batch.gemm_shapes",
        reads=(
            "training.bf16",
            "training.fp16",
            "training.tf32",
            "data.packing",
            "spec:model.dtype",
            "spec:model.task",
            "spec:data.seq_len",
            "spec:training.objective",
        ),
        writes=(),
        apply=gemm_shapes,
        doc="suggest a vocabulary and padded length in multiples of the tensor-core shape.",
    ),
)
