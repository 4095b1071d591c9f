"""When nothing fits: what is on, and only the fixes the same memory model says fit.

Issue 11 item 11: a fix is printed only if re-solving the fit problem with it (plan/fit/search.py,
the model that refused the plan) finds a split that fits, and never a setting the spec
already has. Each candidate changes one thing:
- a memory saver the spec fixed (gradient checkpointing, the optimizer, chunked cross-entropy)
  set to "auto";
- model.dtype = "bfloat16" (on a GPU with bf16; float32 weights only);
- data.seq_len halved, down to 128;
- more GPUs of the same kind, fully sharded (FSDP FULL_SHARD; strategy "auto" or "fsdp");
- the smallest catalog GPU of the same vendor with more memory that fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.hardware.catalog import load_catalog
from gpuplan.plan.fit.savers import KNOBS, SAVERS, user_saver_label
from gpuplan.plan.fit.search import FitProblem, FitSolution, Sharding, solve
from gpuplan.units import GIB

MAX_GPUS_PER_NODE = 8  # HGX/DGX nodes
VERIFIED = "re-solved by the fit search with this one change"


@dataclass(frozen=True)
class Fix:
    """One change that makes the run fit, as data: the spec values it sets and why; its words are
    rendered by gpuplan/plan/fit/fix_words.py (fix_line)."""

    kind: str  # "saver" | "dtype" | "seq_len" | "gpus" | "gpu" | "host" (fit/host_memory.py)
    values: tuple[tuple[str, Any], ...]  # (spec key, value) in the order said: (("training.optim", "auto"),)
    why: str | None = None  # said after the lines, in parentheses
    qualifier: str | None = None  # words right after the value ("or more, if the training hosts have that RAM")
    verified: str = VERIFIED  # how the fit was checked

    @property
    def hardware(self) -> bool:
        return self.kind in ("gpus", "gpu")

    @property
    def changes(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class NoFit:
    """Why nothing fits and what would: the record the memory.fit error is drawn from, and that
    the hardware alternatives (fit/hardware_alternatives.py) read instead of its text."""

    method: str  # the method the spec asks for ("full", "lora", "qlora"; the last one tried for "auto")
    solution: FitSolution  # the refused candidate: every auto saver on, smallest batch
    fixes: tuple[Fix, ...]  # one-key fixes, each verified
    method_alternatives: tuple[str, ...]  # adapter methods that fit (full fine-tuning only)
    diagnostic: Diagnostic  # the error as reported

    def shown_fixes(self, *, drop_hardware: bool = False) -> tuple[Fix, ...]:
        """The one-key fixes fix_text says, as records."""
        return tuple(f for f in self.fixes if not (drop_hardware and f.hardware))


class NoFitError(GpuplanError):
    """The refusal of a plan that does not fit, with what would fit as data: `options`, each the spec
    values one fix sets (the one-key fixes its text names, the hardware planned in full), read by init
    (init/starter_fit.py) instead of the fix's words."""

    def __init__(self, diagnostics: list[Diagnostic], no_fit: NoFit, options: tuple[Mapping[str, Any], ...]):
        super().__init__(diagnostics)
        self.no_fit = no_fit
        self.options = options


def savers_on(sol: FitSolution, user_set: set[str]) -> str:
    """What the refused candidate runs with, auto savers and the spec's own."""
    k = sol.knobs
    on = list(sol.savers)
    for knob in KNOBS:
        label = user_saver_label(knob, getattr(k, knob)) if knob in user_set else None
        if label:
            on.append(f"{label} (set by the spec)")
    if k.sharding.engine in ("fsdp", "deepspeed"):
        on.append(k.sharding.label)
    if not on:
        return "no memory saver"
    return ("every saver on (" if len(sol.savers) > 1 else "") + ", ".join(on) + (")" if len(sol.savers) > 1 else "")


def saver_fixes(p: FitProblem, user_set: set[str]) -> list[Fix]:
    """Savers the spec can switch on that the fit search does not choose itself (Liger's kernels,
    activation offloading), each checked by solving again with it on."""
    from gpuplan.plan.estimate.memory import liger, offload_activations

    fixes = []
    base, gpu = p.base, p.gpu
    if not base.liger_kernel and not liger.unavailable(p.facts.model_type, base.task, gpu.vendor, gpu.name):
        q = dataclasses.replace(
            p,
            base=dataclasses.replace(base, liger_kernel=True, loss_chunk_size=0),
            auto=p.auto - {"loss_chunk_size"},
            fixed=dataclasses.replace(p.fixed, loss_chunk_size=0),
        )
        if _fits(q):
            fixes.append(
                Fix("saver", (("training.use_liger_kernel", True),), "Liger's fused linear cross-entropy; pip install liger-kernel")
            )
    ckpt_fixed = "gradient_checkpointing" in user_set and p.fixed.gradient_checkpointing
    link = gpu.interconnect.get("pcie") or 0.0
    if not base.offload_activations and not offload_activations.unavailable(base.device, ckpt_fixed, link):
        q = dataclasses.replace(
            p,
            base=dataclasses.replace(base, offload_activations=True),
            auto=p.auto - {"gradient_checkpointing"},
            fixed=dataclasses.replace(p.fixed, gradient_checkpointing=False),
        )
        if sol := _fits(q):
            moved = sol.estimate.offloaded_activation_bytes
            seconds = offload_activations.transfer_seconds(moved, sol.accumulation, link)
            per_step = f"{seconds:,.0f}" if seconds >= 10 else f"{seconds:.2g}"  # never 1.2e+02
            fixes.append(
                Fix(
                    "saver",
                    (("training.activation_offloading", True),),
                    f"{moved / GIB:.0f} GiB of host RAM per GPU, {per_step} s per step over the host link",
                )
            )
    return fixes


def _fits(p: FitProblem) -> FitSolution | None:
    sol = solve(p)
    return sol if sol.fits else None


def verified_fixes(
    p: FitProblem, *, user_set: set[str], strategy: str, count: int, nodes: int, headroom: float, effective_set: bool
) -> list[Fix]:
    fixes: list[Fix] = []
    # savers the spec fixed
    for knob, key in dict((s.knob, s.setting) for s in SAVERS).items():
        if knob in user_set and _fits(dataclasses.replace(p, auto=p.auto | {knob})):
            fixes.append(Fix("saver", ((key, "auto"),)))
    fixes += saver_fixes(p, user_set)
    # bf16 weights
    if p.base.weight_dtype == "float32" and p.gpu.bf16 and p.base.device == "cuda":
        base = dataclasses.replace(p.base, weight_dtype="bfloat16", amp="bf16" if p.base.amp else None)
        if _fits(dataclasses.replace(p, base=base)):
            fixes.append(Fix("dtype", (("model.dtype", "bfloat16"),)))
    # a shorter sequence; online RL (grpo / rloo): shorter completions, the prompts are the data's
    if p.base.generation != "none":
        prompt, completion = p.base.seq_len - p.base.rl_completion_len, p.base.rl_completion_len // 2
        while completion >= 64:
            shorter = dataclasses.replace(p.base, seq_len=prompt + completion, rl_completion_len=completion)
            if _fits(dataclasses.replace(p, base=shorter)):
                fixes.append(Fix("seq_len", (("rl.max_completion_length", completion),)))
                break
            completion //= 2
    seq = p.base.seq_len // 2
    while seq >= 128 and p.base.generation == "none":
        if _fits(dataclasses.replace(p, base=dataclasses.replace(p.base, seq_len=seq))):
            fixes.append(Fix("seq_len", (("data.seq_len", seq),)))
            break
        seq //= 2
    # more GPUs, fully sharded
    world = count * nodes
    if p.base.device == "cuda" and strategy in ("auto", "fsdp"):
        for factor in (2, 4, 8, 16):
            new_world = world * factor
            # an effective batch is split over more GPUs; without one each GPU keeps its samples
            samples = p.samples_per_device
            if effective_set:
                if (p.samples_per_device * world) % new_world:
                    continue
                samples = p.samples_per_device * world // new_world
            ub, ua = p.user_batch, p.user_accumulation
            if (ua is not None and samples % ua) or (ub is not None and ua is not None and ub * ua != samples):
                continue  # the spec's own split would not hold: not a one-key fix
            per_node = min(new_world, max(count, MAX_GPUS_PER_NODE))
            if new_world % per_node:
                continue
            sh = Sharding("fsdp", 3, new_world, False, False, "full_shard")
            # online RL: a round's sequences per GPU shrink with the samples per GPU (rl.generation_batch_size / world)
            gen = p.base.generation_sequences * samples // max(p.samples_per_device, 1)
            base = dataclasses.replace(p.base, generation_sequences=gen) if p.base.generation != "none" else p.base
            q = dataclasses.replace(p, base=base, world_size=new_world, samples_per_device=samples, shardings=(sh,))
            if _fits(q):
                where: tuple[tuple[str, Any], ...] = (("hardware.count", per_node),)
                if new_world > per_node:
                    where += (("hardware.nodes", new_world // per_node),)
                fixes.append(Fix("gpus", where, f"FSDP full_shard over {new_world} GPUs"))
                break
    # a larger GPU
    bigger = sorted(
        (g for g in load_catalog().values() if g.vendor == p.gpu.vendor and g.memory_bytes > p.gpu.memory_bytes),
        key=lambda g: g.memory_bytes,
    )
    for gpu in bigger:
        if _fits(dataclasses.replace(p, gpu=gpu, usable_bytes=int(gpu.memory_bytes * (1 - headroom)))):
            fixes.append(Fix("gpu", (("hardware.gpu", gpu.name),)))
            break
    return fixes
