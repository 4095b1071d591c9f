"""The parts of a Plan that assemble (plan/build.py) draws from the solved fit: the memory section,
the communication the step time holds, the cost, what is trained, and the fixed-costs advice."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuplan.hardware.prices import price_for
from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.checks.fixed_costs import fixed_costs_advice, fixed_share
from gpuplan.plan.estimate.throughput import estimate_throughput
from gpuplan.plan.fit.savers import saver_cost
from gpuplan.plan.fit.search import workload as solve_workload
from gpuplan.plan.methods import method_named
from gpuplan.plan.rules.chat_data import packing_holds
from gpuplan.plan.sections import MemorySection, Saver, ThroughputSection


def step_advice(throughput, wl, problem, sol, resolved, facts, gpu, tf32, comm, example_lengths=None):
    """The fixed-costs advice (plan/checks/fixed_costs.py), checked with the same memory and step models
    (a preference objective's padded lengths: plan/estimate/padding.py)."""
    from gpuplan.plan.fit.search import fits_in_memory, price

    def share_at(new):
        return fixed_share(
            estimate_throughput(
                facts,
                new,
                gpu,
                max_steps=None,
                world_size=throughput.world_size or 1,
                tf32=tf32,
                comm=comm,
                example_lengths=example_lengths,
            ).step_time
        )

    packing = resolved["data.packing"].value if "data.packing" in resolved else None
    packable = packing_holds(resolved["training.objective"].value, facts.task, resolved["data.format"].value, facts.model_type)
    return fixed_costs_advice(
        throughput.step_time,
        wl,
        user_batch=problem.user_batch,
        user_accumulation=problem.user_accumulation,
        samples_per_device=problem.samples_per_device,
        packing=packing,
        packable=packable,
        fits=lambda b: fits_in_memory(price(problem, b, sol.knobs), problem),
        share_at=share_at,
    )


def cost_section(
    throughput: ThroughputSection,
    gpu_name: str,
    world: int,
    *,
    spec_price: float | None,
    user_prices: Mapping[str, tuple[float, str]] | None,
) -> dict[str, Any]:
    """price_per_gpu_hour, price_source, cost_usd (run time x GPUs x price); None where unknown."""
    price = price_for(gpu_name, spec_price=spec_price, user_prices=user_prices)
    run = throughput.run_time_s
    return {
        "price_per_gpu_hour": price.usd_per_gpu_hour if price else None,
        "price_source": price.source if price else None,
        "cost_usd": run / 3600 * world * price.usd_per_gpu_hour if price and run is not None else None,
    }


def trainable_section(method: str, resolved, facts: ModelFacts, checkpointing: bool, frozen_params: int = 0) -> dict[str, Any]:
    """model.method, model.trainable_params and model.total_params (as peft's
    get_nb_trainable_parameters counts them), and the adapters per target for lora/qlora.
    `frozen_params`: what a full fine-tune leaves frozen (a VLM's vision tower: apply/model/vision.py)."""
    count = resolved[0] if resolved else None
    if not method_named(method).frozen_base or count is None:
        return {"method": method, "trainable_params": facts.n_params - frozen_params, "total_params": facts.n_params}
    return {
        "method": method,
        "trainable_params": count.trainable_params,
        "total_params": count.total_params,
        # apply reads this: checkpointing with a frozen base needs the embeddings' output to require grad
        "adapters": {**count.to_dict(), "enable_input_require_grads": bool(checkpointing)},
    }


def with_communication(throughput: ThroughputSection, comm: dict[str, Any]) -> ThroughputSection:
    """Attach the data-parallel communication section; the step-time model already priced
    it (plan/estimate/comm_time.py), so compute_step_time_s is the step without what of it
    compute does not hide."""
    step = throughput.step_time_s
    if step is None:
        return dataclasses.replace(throughput, compute_step_time_s=None, communication=comm)
    terms = (throughput.step_time or {}).get("terms", [])
    exposed = sum(t["exposed_s"] for t in terms if t["group"] == "communication")
    out = dataclasses.replace(throughput, compute_step_time_s=step - exposed, communication=comm)
    if comm.get("time_s"):
        out = dataclasses.replace(
            out,
            notes=(
                *throughput.notes,
                f"the step time includes {exposed:.3g} s of data-parallel communication that compute does not hide"
                if exposed
                else f"the {comm['time_s']:.3g} s of data-parallel communication per step hide behind compute "
                "(overlapped: plan/estimate/comm_time.py)",
            ),
        )
    return out


def memory_section(sol, problem, gpu: GPUProfile, headroom: float, count: int = 1) -> MemorySection:
    """The memory section of the solution's estimate; build adds the workload and method."""
    from gpuplan.plan.estimate.memory.host import host_memory

    est = sol.estimate.to_dict()
    host = None
    if not gpu.is_cpu:  # host RAM per node (CPU ranks: the host is the device)
        host = host_memory(
            problem.facts, solve_workload(problem, sol.per_device_batch, sol.knobs), est["host_bytes"], est["host_pinned_bytes"], count
        ).to_dict()
    return MemorySection(
        allocated_peak_bytes=est["allocated_peak_bytes"],
        reserved_peak_bytes=est["reserved_peak_bytes"],
        capacity_bytes=gpu.memory_bytes,
        usable_bytes=problem.usable_bytes,
        headroom=headroom,
        fits=sol.fits,
        components=est["components"],
        host_bytes=est["host_bytes"],  # offloaded to host RAM, per GPU
        host=host,
        layout=sol.knobs.sharding.label,
        savers=tuple(Saver(n, sol.saved_bytes.get(n), saver_cost(n, problem.base.weight_dtype, problem)) for n in sol.savers),
        notes=tuple(est["notes"]),
    )
