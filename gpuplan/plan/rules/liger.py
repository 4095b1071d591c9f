"""liger.kernels: Liger's Triton kernels where they can run (memory/liger.py), refused where not.

training.use_liger_kernel = true is the Trainer's own switch (TrainingArguments.use_liger_kernel):
the fused linear cross-entropy and the RMSNorm / SwiGLU / RoPE kernels of the families Liger
patches. The plan prices the fused loss (memory.fit reads the key), refuses CPUs, AMD
architectures and families Liger cannot patch with the reason, and says the package must be on
the training machines when it is not here.
"""

from __future__ import annotations

import dataclasses

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.liger import KEY, unavailable
from gpuplan.plan.fit.search import price
from gpuplan.plan.inputs.target import install_note, is_local
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION
from gpuplan.units import gib


def saving(sol, problem) -> str:
    """What Liger's fused loss saves at this plan's batch: the same plan priced with transformers' loss."""
    without = dataclasses.replace(problem, base=dataclasses.replace(problem.base, liger_kernel=False))
    plain = price(without, sol.per_device_batch, sol.knobs)
    saved = plain.reserved_peak_bytes - sol.estimate.reserved_peak_bytes
    return (
        f"Liger kernels: the fused linear cross-entropy never holds the [{sol.per_device_batch * problem.base.seq_len:,}"
        f" x {problem.facts.vocab_size:,}] logits (loss path {gib(sol.estimate.components['logits_loss'])} at the peak, "
        f"{gib(plain.components['logits_loss'])} with transformers' loss): the peak is {gib(saved)} lower; "
        "the RMSNorm / SwiGLU / RoPE kernels' savings are not counted (Triton, not traceable here)"
    )


def kernels(ctx: Resolver) -> None:
    if not ctx.spec(KEY):
        ctx.keep(KEY)
        return
    why_not = unavailable(ctx.facts.model_type, ctx.spec("model.task"), ctx.gpu.vendor, ctx.gpu.name)
    if why_not:
        ctx.error(KEY, f"{KEY} = true cannot run: {why_not}", fix=f"set {KEY} = false (or remove it)")
        return
    chunk = ctx.spec("training.loss_chunk_size")
    if chunk not in ("auto", 0):
        ctx.error(
            KEY,
            f"{KEY} = true and training.loss_chunk_size = {chunk}: Liger's fused linear cross-entropy "
            "replaces the loss that chunking would split",
            fix='set training.loss_chunk_size = "auto" or 0',
        )
        return
    ctx.keep(KEY)
    sol, problem = ctx.get(FIT_SOLUTION), ctx.get(FIT_PROBLEM)
    if sol is not None and problem is not None:
        ctx.note(KEY, saving(sol, problem))
    if not ctx.environment.has("liger_kernel"):
        if is_local(ctx.spec):
            ctx.error(
                KEY,
                f"{KEY} = true needs the liger-kernel package, which is not installed here",
                fix="pip install liger-kernel, or set training.use_liger_kernel = false",
            )
        else:
            install_note(ctx, KEY, "liger_kernel", f"{KEY} = true")


RULES = (
    Rule(
        "liger.kernels",
        reads=(
            FIT_SOLUTION,
            FIT_PROBLEM,
            "spec:" + KEY,
            "spec:training.loss_chunk_size",
            "spec:model.task",
            "spec:hardware.gpu",
            "spec:hardware.nodes",
        ),
        writes=(KEY,),
        apply=kernels,
        doc="Liger's kernels on CUDA/ROCm GPUs for the families it patches; refused elsewhere with the reason.",
    ),
)
