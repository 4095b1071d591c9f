"""`gpuplan plan --trace`: check a plan's memory figure by tracing its workload.

The plan's analytic figures stay the plan's; the traced estimate is added beside
them (memory.traced) with the difference, so a user sees how far to trust them.
"""

from __future__ import annotations

import dataclasses

from gpuplan.modelinfo import read_config
from gpuplan.plan.types import Plan


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
    diff = (analytic - traced.allocated_peak_bytes) / traced.allocated_peak_bytes
    memory = dataclasses.replace(plan.memory, traced={**traced.to_dict(), "analytic_minus_traced_fraction": diff})
    return dataclasses.replace(plan, memory=memory)
