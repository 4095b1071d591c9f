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
from dataclasses import dataclass

from gpuplan.errors import Diagnostic
from gpuplan.hardware.catalog import load_catalog
from gpuplan.plan.fit.savers import KNOBS, SAVERS, user_saver_label
from gpuplan.plan.fit.search import FitProblem, FitSolution, Sharding, solve
from gpuplan.units import GIB

MAX_GPUS_PER_NODE = 8  # HGX/DGX nodes
ONE_KEY_HEAD = "any one of these fits (checked with the same memory model): "
VERIFIED = "re-solved by the fit search with this one change"


@dataclass(frozen=True)
class Fix:
    """One change that makes the run fit, as spec lines."""

    kind: str  # "saver" | "dtype" | "seq_len" | "gpus" | "gpu" | "host" (fit/host_memory.py)
    text: str  # the lines to set: 'training.optim = "auto"'
    verified: str = VERIFIED  # how the fit was checked

    @property
    def hardware(self) -> bool:
        return self.kind in ("gpus", "gpu")


@dataclass(frozen=True)
class NoFit:
    """Why nothing fits and what would: the record the memory.fit error is drawn from, and that
    the hardware alternatives (fit/hardware_alternatives.py) read instead of its text."""

    method: str  # the method the spec asks for ("full", "lora", "qlora"; the last one tried for "auto")
    solution: FitSolution  # the refused candidate: every auto saver on, smallest batch
    fixes: tuple[Fix, ...]  # one-key fixes, each verified
    method_alternatives: tuple[str, ...]  # adapter methods that fit (full fine-tuning only)
    diagnostic: Diagnostic  # the error as reported

    def fix_text(self, *, drop_hardware: bool = False) -> str | None:
        return no_fit_fix(self.fixes, self.method_alternatives, drop_hardware=drop_hardware)


def no_fit_fix(fixes: tuple[Fix, ...], method_alternatives: tuple[str, ...], *, drop_hardware: bool = False) -> str | None:
    """The no-fit error's fix: the fitting methods, then the one-key fixes (without the hardware
    ones when the caller lists the hardware that fits, each planned in full)."""
    names = [a.split(" ", 1)[0] for a in method_alternatives]  # each line starts with its method (method_alternatives.py)
    which = "the fitting method above" if len(names) == 1 else "one of the fitting methods above"
    parts = [f"add the lines of {which} ({' or '.join(names)})"] if names else []
    kept = [f.text for f in fixes if not (drop_hardware and f.hardware)]
    if kept:
        parts.append(ONE_KEY_HEAD + "; ".join(kept))
    return "; or ".join(parts) or None


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
            fixes.append(Fix("saver", "training.use_liger_kernel = true (Liger's fused linear cross-entropy; pip install liger-kernel)"))
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
            fixes.append(
                Fix(
                    "saver",
                    f"training.activation_offloading = true ({moved / GIB:.0f} GiB of host RAM "
                    f"per GPU, {seconds:.2g} s per step over the host link)",
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
            fixes.append(Fix("saver", f'{key} = "auto"'))
    fixes += saver_fixes(p, user_set)
    # bf16 weights
    if p.base.weight_dtype == "float32" and p.gpu.bf16 and p.base.device == "cuda":
        base = dataclasses.replace(p.base, weight_dtype="bfloat16", amp="bf16" if p.base.amp else None)
        if _fits(dataclasses.replace(p, base=base)):
            fixes.append(Fix("dtype", 'model.dtype = "bfloat16"'))
    # a shorter sequence
    seq = p.base.seq_len // 2
    while seq >= 128:
        if _fits(dataclasses.replace(p, base=dataclasses.replace(p.base, seq_len=seq))):
            fixes.append(Fix("seq_len", f"data.seq_len = {seq}"))
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
            q = dataclasses.replace(p, world_size=new_world, samples_per_device=samples, shardings=(sh,))
            if _fits(q):
                where = f"hardware.count = {per_node}" + (f", hardware.nodes = {new_world // per_node}" if new_world > per_node else "")
                fixes.append(Fix("gpus", f"{where} (FSDP full_shard over {new_world} GPUs)"))
                break
    # a larger GPU
    bigger = sorted(
        (g for g in load_catalog().values() if g.vendor == p.gpu.vendor and g.memory_bytes > p.gpu.memory_bytes),
        key=lambda g: g.memory_bytes,
    )
    for gpu in bigger:
        if _fits(dataclasses.replace(p, gpu=gpu, usable_bytes=int(gpu.memory_bytes * (1 - headroom)))):
            fixes.append(Fix("gpu", f'hardware.gpu = "{gpu.name}"'))
            break
    return fixes
