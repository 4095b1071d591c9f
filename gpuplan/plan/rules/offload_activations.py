"""offload_activations.check: offloading where it can help, priced; refused where it cannot.

training.activation_offloading = true keeps the tensors autograd saves in pinned host RAM
(memory/offload_activations.py). The plan counts the host RAM per GPU (the host memory check
of rules/distributed.py adds it to the node's), the host-link time per step
(throughput.saver_seconds), and refuses it on a CPU and beside gradient checkpointing.
"""

from __future__ import annotations

import dataclasses

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.offload_activations import KEY, transfer_seconds, unavailable
from gpuplan.plan.estimate.step_time.constants import HOST_COPY_FRACTION
from gpuplan.plan.fit.search import price
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION
from gpuplan.units import gib


def check(ctx: Resolver) -> None:
    ctx.keep(KEY)
    if not ctx.spec(KEY):
        return
    ckpt = ctx.spec("training.gradient_checkpointing") is True
    link = ctx.gpu.interconnect.get("pcie") or 0.0
    why_not = unavailable("cpu" if ctx.gpu.is_cpu else "cuda", ckpt, link)
    if why_not:
        fix = f"set {KEY} = false" + (' or training.gradient_checkpointing = "auto"' if ckpt else "")
        ctx.error(KEY, f"{KEY} = true: {why_not}", fix=fix)
        return
    sol, problem = ctx.get(FIT_SOLUTION), ctx.get(FIT_PROBLEM)
    if sol is None or problem is None:
        return
    moved = sol.estimate.offloaded_activation_bytes
    seconds = transfer_seconds(moved, sol.accumulation, link)
    without = price(
        dataclasses.replace(problem, base=dataclasses.replace(problem.base, offload_activations=False)), sol.per_device_batch, sol.knobs
    )
    saved = without.reserved_peak_bytes - sol.estimate.reserved_peak_bytes
    summary = (
        f"activation offloading: {gib(moved)} of saved activations per micro-batch in pinned host RAM per GPU, "
        f"copied out in forward and back in backward over the {link:g} GB/s host link (pinned copies reach "
        f"{HOST_COPY_FRACTION:.0%} of it): +{seconds:.3g} s per step "
        f"(not overlapped); the GPU peak is {gib(saved)} lower"
    )
    if without.reserved_peak_bytes <= problem.usable_bytes:
        ctx.warn(KEY, summary + "; the run fits without it", fix=f"set {KEY} = false to save that time")
    else:
        ctx.note(KEY, summary)


RULES = (
    Rule(
        "offload_activations.check",
        reads=(FIT_SOLUTION, FIT_PROBLEM, "spec:" + KEY, "spec:training.gradient_checkpointing", "spec:hardware.gpu"),
        writes=(KEY,),
        apply=check,
        doc="activation offloading priced in host RAM and host-link time; refused on CPU and with checkpointing.",
    ),
)
