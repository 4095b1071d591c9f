"""loss_chunking.auto: chunked cross-entropy only when the run needs it (estimate/memory/loss_chunking.py).

The head and the loss over chunks of tokens, each recomputed in backward: the
[tokens, vocab] logits and their fp32 copies never exist at once, for one more head
forward (a few % of the step). memory.fit turns it on when nothing cheaper fits; a size
the spec sets is kept, and refused where the model's forward cannot take it.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.loss_chunking import KEY, NAME, unavailable
from gpuplan.plan.fit.savers import saver_cost
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION
from gpuplan.units import gib


def chunking(ctx: Resolver) -> None:
    want = ctx.spec(KEY)
    why_not = unavailable(ctx.facts.model_type, ctx.spec("model.task"))
    if want not in ("auto", 0) and why_not:
        ctx.error(KEY, f"{KEY} = {want} cannot run: {why_not}", fix=f"set {KEY} = 0 (or remove it)")
        return
    if want != "auto":
        ctx.keep(KEY)
        return
    sol, problem = ctx.get(FIT_SOLUTION), ctx.get(FIT_PROBLEM)
    if ctx.spec("training.use_liger_kernel"):
        why_not = "Liger's fused linear cross-entropy (training.use_liger_kernel) already never holds the full logits"
    if why_not:
        ctx.resolve(KEY, 0, f"off: {why_not}")
        return
    if sol is None or problem is None:
        ctx.resolve(KEY, 0, "off: the batch split did not resolve")
        return
    chunk = sol.knobs.loss_chunk_size
    cost = saver_cost(NAME, problem.base.weight_dtype, problem)
    tokens = sol.per_device_batch * problem.base.seq_len
    vocab = problem.facts.vocab_size
    if chunk:
        saved = sol.saved_bytes.get(NAME)
        why = (
            f"per-device batch {sol.per_device_batch} does not fit without it: the output head and the loss "
            f"run over {chunk:,}-token chunks, each recomputed in backward, so the [{tokens:,} x {vocab:,}] "
            f"logits and their fp32 copies never exist at once: saves {gib(saved)} ({cost})"
        )
    else:
        why = f"off: the run fits without chunking the loss ({cost})"
    ctx.resolve(KEY, chunk, why)


RULES = (
    Rule(
        "loss_chunking.auto",
        reads=(FIT_SOLUTION, FIT_PROBLEM, "spec:" + KEY, "spec:model.task", "spec:training.use_liger_kernel"),
        writes=(KEY,),
        apply=chunking,
        doc="chunked cross-entropy only when the run does not fit without it; refused where the model cannot.",
    ),
)
