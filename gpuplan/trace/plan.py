"""`gpuplan plan --trace`: check a plan's memory figure by tracing its workload.

The plan's analytic figures stay the plan's; the traced estimate is added beside
them (memory.traced) with the difference, so a user sees how far to trust them.
"""

from __future__ import annotations

import dataclasses

from gpuplan.modelinfo import read_config
from gpuplan.plan.types import Plan


def _with_generation(plan: Plan, config, wl, traced):
    """grpo / rloo: the trace runs the training step and holds the round's tensors; the generation moment
    (transformers' KV cache, vLLM's share) cannot run on fake tensors, so its analytic part is added
    (plan/estimate/memory/generation.py), and the note says so."""
    from gpuplan.hardware.profile import GPUProfile
    from gpuplan.modelinfo import model_facts
    from gpuplan.plan.estimate.memory.generation import with_generation

    hw = {k: v for k, v in plan.hardware.to_dict().items() if k not in ("count", "nodes")}
    gpu = GPUProfile.from_dict(hw) if hw.get("name") and hw.get("peak_tflops") is not None else None
    facts = model_facts(config, wl.task)
    out = with_generation(facts, wl, traced, gpu, rollout_counted=True)
    note = f"{wl.generation} generation: its memory is the analytic model's (fake tensors cannot sample), added to the traced step"
    return dataclasses.replace(out, method="traced", notes=(*out.notes, note))


def trace_plan(plan: Plan) -> Plan:
    from gpuplan.hub.fetch import model_dir  # a Hub id: its cached snapshot, where planning put config.json
    from gpuplan.trace import trace_memory  # imports torch

    source = plan.resolved.model.config or model_dir(plan.resolved.model.hub)
    wl, analytic = plan.memory.workload, plan.memory.allocated_peak_bytes
    # a plan that was made read its model's config and priced a workload (plan/build.py assemble)
    assert source is not None and wl is not None and analytic is not None, "a plan made by the planner"
    config = read_config(source)
    if wl.engine != "none":
        # A data-parallel rank runs the same micro-batch; sharding is priced analytically.
        wl = dataclasses.replace(wl, engine="none", zero_stage=0, shard_world_size=1, offload_optimizer=False, offload_params=False)
    if wl.gradient_accumulation_steps > 2:
        # From the second micro-batch on, every micro-batch of a step holds the same
        # tensors (gradients live across them), so two show the peak of any number.
        wl = dataclasses.replace(wl, gradient_accumulation_steps=2)
    liger = wl.liger_kernel
    wl = dataclasses.replace(wl, liger_kernel=False)
    traced = trace_memory(config, wl, compute_capability=plan.hardware.compute_capability)
    if liger:  # memory/liger.py: Triton kernels, CUDA/ROCm only
        traced = dataclasses.replace(
            traced,
            notes=(
                *traced.notes,
                "Liger's kernels are Triton GPU kernels and cannot "
                "run on fake CPU tensors: traced with transformers' own loss and "
                "layers (the plan counts Liger's fused loss)",
            ),
        )
    if wl.generation != "none":
        traced = _with_generation(plan, config, wl, traced)
    diff = (analytic - traced.allocated_peak_bytes) / traced.allocated_peak_bytes
    memory = dataclasses.replace(plan.memory, traced={**traced.to_dict(), "analytic_minus_traced_fraction": diff})
    return dataclasses.replace(plan, memory=memory)
