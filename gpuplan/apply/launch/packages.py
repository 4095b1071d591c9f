"""Packages a plan needs, checked on the machine that applies it (issue 11 item 16).

A plan made for another machine keeps what the spec asked for (DeepSpeed, a bitsandbytes
or other optimizer, flash-attn, a compile backend, the trackers of training.report_to)
and notes what to install there. Here,
before anything loads, apply checks those modules exist (importlib.util.find_spec: no
import), so a missing one is one clear error with the pip command, not a traceback from
deep inside the Trainer.
"""

from __future__ import annotations

from importlib.util import find_spec

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.inputs.environment import PIP_NAMES
from gpuplan.plan.rules.optimizer import NEEDS_PACKAGE
from gpuplan.plan.types import Plan
from gpuplan.spec.names import BNB_OPTIMIZERS, COMPILE_BACKEND_PACKAGES
from gpuplan.spec.trackers import TRACKERS, requested


def needed_packages(plan: Plan) -> list[tuple[str, str]]:
    """(key path, module) for every package the plan's values need beyond torch/transformers."""
    return [(key, module) for key, _, module in _needs(plan)]


def _needs(plan: Plan) -> list[tuple[str, object, str]]:
    """(key path, its value, module) for every package the plan's values need."""
    r = plan.resolved
    out: list[tuple[str, object, str]] = []
    if r.distributed.strategy == "deepspeed":
        out.append(("distributed.strategy", r.distributed.strategy, "deepspeed"))
    optim = r.training.optim
    if optim in BNB_OPTIMIZERS:
        out.append(("training.optim", optim, "bitsandbytes"))
    elif optim in NEEDS_PACKAGE:
        out.append(("training.optim", optim, NEEDS_PACKAGE[optim]))
    if r.training.use_liger_kernel:
        out.append(("training.use_liger_kernel", True, "liger_kernel"))
    if r.model.attn_implementation == "flash_attention_2":
        out.append(("model.attn_implementation", r.model.attn_implementation, "flash_attn"))
    if r.training.objective.is_preference or r.training.objective.is_rl:  # TRL's DPO / KTO / GRPO / RLOO trainers
        out.append(("training.objective", r.training.objective.name, "trl"))
    if r.training.objective.is_rl and r.rl.use_vllm:  # TRL's vLLM generation (trl/generation/vllm_generation.py)
        out.append(("rl.generation_backend", r.rl.generation_backend, "vllm"))
    backend = r.training.torch_compile_backend if r.training.torch_compile else None
    if backend in COMPILE_BACKEND_PACKAGES:
        out.append(("training.torch_compile_backend", backend, COMPILE_BACKEND_PACKAGES[backend]))
    report_to = r.training.report_to if isinstance(r.training.report_to, str) else list(r.training.report_to)
    for name in requested(report_to):  # the Trainer's tracker integrations
        out += [("training.report_to", report_to, m) for m in TRACKERS.get(name, ((), ""))[0]]
    return out


def _pip_names(missing: list[tuple[str, str]]) -> list[str]:
    trackers = {m: TRACKERS[n][1] for n, (mods, _) in TRACKERS.items() for m in mods}
    return list(dict.fromkeys(PIP_NAMES.get(m) or (trackers.get(m) if key == "training.report_to" else None) or m for key, m in missing))


def check_packages(plan: Plan) -> None:
    needs = [(key, value, mod) for key, value, mod in _needs(plan) if find_spec(mod) is None]
    missing = [(key, mod) for key, _, mod in needs]
    if missing:
        raise ApplyError(
            "the plan needs packages this machine does not have: "
            + "; ".join(f"{key} = {value!r} needs {mod}" for key, value, mod in needs)
            + ". Install them: pip install "
            + " ".join(_pip_names(missing))
        )
