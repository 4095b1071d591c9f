"""Optimizer choice (guide: "Optimizers"; docs/design.md rules).

auto: adamw_torch_fused (one fused kernel per step, CUDA and CPU);
under memory pressure the fit search may pick bitsandbytes' 8-bit AdamW, then
Adafactor (memory.fit). A requested optimizer that this transformers removed, or
whose package is missing, is resolved to its nearest available equivalent with a
reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.paging import is_paged, paged_share, paging_wording
from gpuplan.plan.fit.savers import ADAFACTOR_OPTIMIZER, EIGHT_BIT_OPTIMIZER
from gpuplan.plan.inputs.target import install_note, is_local, target_packages
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION
from gpuplan.spec.names import BNB_OPTIMIZERS, REMOVED_OPTIMIZERS
from gpuplan.units import gib

# Optimizers needing a package beyond torch/transformers (trainer_optimizer.py in 5.24).
NEEDS_PACKAGE = {
    "adamw_torch_4bit": "torchao",
    "adamw_torch_8bit": "torchao",
    "adamw_anyprecision": "torchdistx",
    "galore_adamw": "galore_torch",
    "galore_adamw_8bit": "galore_torch",
    "galore_adafactor": "galore_torch",
    "galore_adamw_layerwise": "galore_torch",
    "galore_adamw_8bit_layerwise": "galore_torch",
    "galore_adafactor_layerwise": "galore_torch",
    "apollo_adamw": "apollo_torch",
    "apollo_adamw_layerwise": "apollo_torch",
    "lomo": "lomo_optim",
    "adalomo": "lomo_optim",
    "grokadamw": "grokadamw",
    "schedule_free_radam": "schedulefree",
    "schedule_free_adamw": "schedulefree",
    "schedule_free_sgd": "schedulefree",
    "stable_adamw": "torch_optimi",
}
NEEDS_DEVICE = {"adamw_torch_xla": "an XLA device", "adamw_torch_npu_fused": "an Ascend NPU"}


def default_optimizer(gpu: GPUProfile) -> str:
    """torch's fused AdamW: one kernel per step on CUDA, and on CPU too since torch 2.4,
    where the default per-tensor loop took 1.9 s of a 2.3 s MiniLM step here."""
    return "adamw_torch_fused"


def requested_optimizer(name: str, gpu: GPUProfile, packages: Mapping[str, str | None]) -> tuple[str, str | None]:
    """The spec's optimizer made runnable here: (name, reason when it had to change)."""
    if name == "auto":
        return name, None
    fallback = default_optimizer(gpu)
    if name in REMOVED_OPTIMIZERS:
        new = REMOVED_OPTIMIZERS[name]
        return new, f"{name} is no longer in transformers 5 (apex/legacy AdamW); {new} is the equivalent it keeps"
    if name in NEEDS_DEVICE:
        return fallback, f"{name} needs {NEEDS_DEVICE[name]}; {gpu.name} gets {fallback}"
    if name in BNB_OPTIMIZERS and not packages.get("bitsandbytes"):
        return fallback, f"{name} needs bitsandbytes, which is not installed; {fallback} instead (pip install bitsandbytes)"
    pkg = NEEDS_PACKAGE.get(name)
    if pkg and not packages.get(pkg):
        return fallback, f"{name} needs the {pkg} package, which is not installed; {fallback} instead"
    return name, None


def select(ctx: Resolver) -> None:
    sol = ctx.get(FIT_SOLUTION)
    asked = ctx.spec("training.optim")
    if sol is None:  # the batch arithmetic failed and is reported; no memory decision to explain
        name, reason = requested_optimizer(asked, ctx.gpu, target_packages(ctx.spec, ctx.environment))
        if name == "auto":
            name, reason = default_optimizer(ctx.gpu), "the default optimizer for this device"
        ctx.resolve("training.optim", name, reason)
        return
    chosen = sol.knobs.optim
    sh = sol.knobs.sharding
    if sh.engine == "deepspeed" and sh.offload_optimizer:
        # apply's DeepSpeed config carries an "optimizer" section: DeepSpeed builds its CPU
        # Adam (DeepSpeedCPUAdam, AdamW mode) and the Trainer builds no optimizer of its own
        why = (
            "DeepSpeed optimizer offload: DeepSpeed's CPU AdamW (DeepSpeedCPUAdam) runs the optimizer step "
            "on the host; this value is not used"
        )
        if asked not in ("auto", "adamw_torch", "adamw_torch_fused"):
            ctx.warn(
                "training.optim",
                f'training.optim = "{asked}" is not used: with optimizer offload DeepSpeed runs its CPU AdamW',
                fix='set distributed.offload_optimizer = false to keep this optimizer, or training.optim = "auto"',
            )
        ctx.resolve("training.optim", chosen, why)
        return
    if asked == "auto":
        if ADAFACTOR_OPTIMIZER.name in sol.savers:
            why = f"memory: Adafactor's factored states save {gib(sol.saved_bytes.get(ADAFACTOR_OPTIMIZER.name))} (slower convergence)"
        elif EIGHT_BIT_OPTIMIZER.name in sol.savers:
            saved = gib(sol.saved_bytes.get(EIGHT_BIT_OPTIMIZER.name))
            why = f"memory: bitsandbytes 8-bit AdamW saves {saved} of optimizer states"
        else:
            why = "torch's fused AdamW kernel: the fastest AdamW in transformers 5 (apex's is gone)"
            problem = ctx.get(FIT_PROBLEM)
            if problem is not None and problem.base.adapters is not None:
                states = sol.estimate.components.get("optimizer_states", 0)
                where = f"{states / 1024**2:.0f} MiB" if states or not sol.estimate.host_bytes else "in host RAM (CPU offload)"
                why += (
                    f"; the adapters' AdamW states are {where}, so an 8-bit optimizer or "
                    "Adafactor would buy almost nothing and is not used for memory"
                )
        ctx.resolve("training.optim", chosen, why)
        return
    _, reason = requested_optimizer(asked, ctx.gpu, target_packages(ctx.spec, ctx.environment))
    ctx.resolve("training.optim", chosen, reason)
    if is_paged(chosen):  # what paging does and does not save (memory/paging.py)
        problem = ctx.get(FIT_PROBLEM)
        paged = int(sol.estimate.components.get("optimizer_states", 0) * paged_share(_trainable_shapes(problem)))
        ctx.note("training.optim", paging_wording(chosen, paged, ctx.gpu.interconnect.get("pcie"), ctx.gpu.is_cpu))
    package = "bitsandbytes" if chosen in BNB_OPTIMIZERS else NEEDS_PACKAGE.get(chosen)
    if package and not is_local(ctx.spec):
        install_note(ctx, "training.optim", package, f'training.optim = "{chosen}"')


def _trainable_shapes(problem) -> list:
    """The shapes of the tensors the optimizer holds states for: the adapters', or every parameter."""
    if problem.base.adapters is not None:
        from gpuplan.plan.estimate.memory.adapters import adapter_layout

        return [s for _, s in adapter_layout(problem.facts, problem.base.adapters).adapter_shapes]
    return [s for _, s in problem.facts.param_shapes]


RULES = (
    Rule(
        "optimizer.select",
        reads=("spec:training.optim", FIT_SOLUTION, FIT_PROBLEM, "spec:hardware.gpu", "spec:hardware.nodes"),
        writes=("training.optim",),
        apply=select,
        doc="auto: fused AdamW on CUDA; 8-bit AdamW or Adafactor under memory pressure; "
        "removed or unavailable optimizers replaced with a reason.",
    ),
)
