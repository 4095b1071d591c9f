"""Fit-to-memory search: the fastest batch split and memory savers that fit.

Pure: every candidate is priced by gpuplan.plan.estimate.memory.estimate_memory.

Order of preference (the guide: larger per-device batches are faster, many
accumulation steps slow training, checkpointing costs ~20%, emptying the cache
~10%; chunked cross-entropy a few %, estimate/memory/loss_chunking.py; fit/savers.py):
  1. no memory saver if any batch fits without one; otherwise the shortest prefix
     of the saver ladder that makes some batch fit, cheapest slowdown first;
  2. within that, the largest per-device batch that fits and is a tensor-core
     multiple (NVIDIA matmul guide: 8 for 16-bit, 64 on A100, 4 for TF32); a user
     batch moves only to the nearest such multiple;
  3. accumulation = samples per device per step / per-device batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, cast

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.types import MemoryEstimate, Workload
from gpuplan.plan.fit.savers import BY_NAME, SAVERS


@dataclass(frozen=True)
class Sharding:
    """How data-parallel ranks share the model states (see Workload)."""

    engine: str = "none"  # none | ddp | fsdp | deepspeed
    zero_stage: int = 0
    shard_world_size: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    fsdp_sharding: str | None = None  # full_shard | shard_grad_op | hybrid_shard (fsdp only)

    @property
    def label(self) -> str:
        if self.engine == "fsdp":
            return f"FSDP {self.fsdp_sharding}" + (" + CPU offload" if self.offload_params else "")
        if self.engine == "deepspeed":
            off = [n for n, on in (("optimizer", self.offload_optimizer), ("parameters", self.offload_params)) if on]
            return f"DeepSpeed ZeRO-{self.zero_stage}" + (f" + {' and '.join(off)} offload" if off else "")
        return {"ddp": "DDP", "none": "single device"}[self.engine]


@dataclass(frozen=True)
class Knobs:
    gradient_checkpointing: bool
    optim: str
    torch_empty_cache_steps: int
    sharding: Sharding = Sharding()
    loss_chunk_size: int = 0  # tokens per chunk of the head + loss; 0 = off (estimate/memory/loss_chunking.py)


@dataclass(frozen=True)
class FitProblem:
    facts: ModelFacts
    gpu: GPUProfile
    base: Workload  # precision, attention, seq_len, task, device; batch fields are replaced
    world_size: int
    usable_bytes: int  # capacity x (1 - headroom)
    samples_per_device: int  # per optimizer step: effective batch / world size
    user_batch: int | None  # per_device_train_batch_size the user set (None: auto)
    user_accumulation: int | None
    fixed: Knobs  # values for knobs the user set; see `auto`
    auto: frozenset[str]  # knobs gpuplan may turn: the savers' knobs (fit/savers.py KNOBS)
    tensor_multiple: int  # per-device batch multiple that makes batch x seq_len a multiple of gemm_multiple
    eight_bit_available: bool
    shardings: tuple[Sharding, ...] = (Sharding(),)  # candidates, cheapest communication first
    gemm_multiple: int = 1  # tensor_core_multiple: what GEMM dimensions should be a multiple of
    host_limit_bytes: int | None = None  # usable host RAM per node, when known (plan/fit/host_memory.py)
    ranks_per_node: int = 1
    min_batch: int = 1  # the smallest per-device batch the trainer runs (objectives.py min_per_device_batch)


@dataclass(frozen=True)
class FitSolution:
    per_device_batch: int
    accumulation: int
    knobs: Knobs
    estimate: MemoryEstimate
    fits: bool
    savers: tuple[str, ...]  # names of the savers turned on, in ladder order
    saved_bytes: dict[str, int] = field(default_factory=dict)  # saver -> reserved bytes it saves
    on_tensor_multiple: bool = True
    smallest_bytes: int | None = None  # when nothing fits: the least memory any candidate needs


def ladder(p: FitProblem) -> list[tuple[tuple[str, ...], Knobs]]:
    """(savers, knobs) to try, cheapest slowdown first; only auto knobs move.

    Sharding comes first: ZeRO-1/2 (FSDP SHARD_GRAD_OP) move no more data than DDP's
    all-reduce and ZeRO-3 1.5x as much (Rajbhandari et al. 2020, section 7), usually
    cheaper than recomputing activations. Then the memory savers on the most sharded
    layout without offload; offload (a CPU optimizer step) last.
    """
    plain = [sh for sh in p.shardings if not (sh.offload_optimizer or sh.offload_params)]
    offload = [sh for sh in p.shardings if sh.offload_optimizer or sh.offload_params]
    steps: list[tuple[tuple[str, ...], Knobs]] = [((), dataclasses.replace(p.fixed, sharding=sh)) for sh in plain]
    widest = plain[-1] if plain else p.shardings[-1]
    savers = _saver_steps(p, widest)
    steps += savers[1:]
    last_names, last_knobs = savers[-1]
    steps += [(last_names, dataclasses.replace(last_knobs, sharding=sh)) for sh in offload]
    return steps


def _saver_steps(p: FitProblem, sharding: Sharding) -> list[tuple[tuple[str, ...], Knobs]]:
    """Cumulative memory savers on one sharding layout, in the saver table's order (fit/savers.py)."""
    k = dataclasses.replace(p.fixed, sharding=sharding)
    steps: list[tuple[tuple[str, ...], Knobs]] = [((), k)]
    names: tuple[str, ...] = ()
    for saver in sorted(SAVERS, key=lambda sv: sv.slowdown(p)):  # cheapest slowdown first (stable)
        if saver.knob in p.auto and saver.available(p, sharding):
            names = tuple(n for n in names if n not in saver.supersedes) + (saver.name,)
            k = dataclasses.replace(k, **{saver.knob: saver.value})
            steps.append((names, k))
    return steps


def batch_candidates(p: FitProblem) -> list[int]:
    """Per-device batches that split samples_per_device exactly, largest first; none below
    min_batch unless nothing else splits it."""
    s = p.samples_per_device
    if p.user_batch is not None and p.user_accumulation is not None:
        return [p.user_batch]
    if p.user_accumulation is not None:
        return [s // p.user_accumulation]
    runnable = [b for b in divisors(s) if b >= p.min_batch]
    return runnable or divisors(s)  # none: the fit rule refuses the batch (rules/memory.py)


def divisors(n: int) -> list[int]:
    """Divisors of n, largest first, in O(sqrt n): effective batches reach 2**24."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)}, reverse=True)


def workload(p: FitProblem, batch: int, knobs: Knobs) -> Workload:
    sh = knobs.sharding
    return dataclasses.replace(
        p.base,
        per_device_batch=batch,
        gradient_accumulation_steps=p.samples_per_device // batch,
        gradient_checkpointing=knobs.gradient_checkpointing,
        optim=knobs.optim,
        torch_empty_cache_steps=knobs.torch_empty_cache_steps,
        loss_chunk_size=knobs.loss_chunk_size,
        engine=cast(Any, sh.engine),  # Sharding holds the same names Workload's Literal lists
        zero_stage=cast(Any, sh.zero_stage),
        shard_world_size=sh.shard_world_size,
        offload_optimizer=sh.offload_optimizer,
        offload_params=sh.offload_params,
    )


def price(p: FitProblem, batch: int, knobs: Knobs) -> MemoryEstimate:
    return estimate_memory(p.facts, workload(p, batch, knobs), p.gpu)


def fits_in_memory(est: MemoryEstimate, p: FitProblem, batch: int | None = None, knobs: Knobs | None = None) -> bool:
    return est.reserved_peak_bytes <= p.usable_bytes and (batch is None or host_fits(p, est, batch, knobs))


def host_fits(p: FitProblem, est: MemoryEstimate, batch: int, knobs: Knobs | None) -> bool:
    """A candidate that keeps states in host RAM (offload) fits only in the host RAM known:
    loading and offloaded states per node (plan/estimate/memory/host.py)."""
    if p.host_limit_bytes is None or not est.host_bytes or knobs is None:
        return True
    from gpuplan.plan.estimate.memory.host import host_memory

    hm = host_memory(p.facts, workload(p, batch, knobs), est.host_bytes, est.host_pinned_bytes, p.ranks_per_node)
    return hm.peak <= p.host_limit_bytes


def _choose(p: FitProblem, fitting: list[int]) -> tuple[int, bool]:
    """Pick among fitting batches (largest first). Returns (batch, is a tensor-core multiple)."""
    m = p.tensor_multiple
    multiples = [b for b in fitting if b % m == 0]
    if p.user_batch is not None and p.user_accumulation is None:
        ub = p.user_batch
        if ub in fitting and ub % m == 0:
            return ub, True
        pool = multiples or fitting
        best = min(pool, key=lambda b: (abs(b - ub), -b))  # nearest, ties to the larger
        return best, best % m == 0
    if p.base.offload_activations:  # host RAM grows with the batch: the smallest (memory/offload_activations.py)
        pool = multiples or fitting
        return pool[-1], pool[-1] % m == 0
    if multiples:
        return multiples[0], True
    return fitting[0], fitting[0] % m == 0


def solve(p: FitProblem) -> FitSolution:
    candidates = batch_candidates(p)
    steps = ladder(p)
    for names, knobs in steps:
        fitting = [b for b in candidates if fits_in_memory(price(p, b, knobs), p, b, knobs)]
        if not fitting:
            continue
        batch, on_multiple = _choose(p, fitting)
        names, knobs = _prune(p, batch, names, knobs)
        est = price(p, batch, knobs)
        saved = {}
        for name in names:
            without = _undo(name, knobs, p.fixed)
            saved[name] = price(p, batch, without).reserved_peak_bytes - est.reserved_peak_bytes
        return FitSolution(batch, p.samples_per_device // batch, knobs, est, True, names, saved, on_multiple)
    # Nothing fits: report the smallest requirement, every saver on, smallest batch.
    names, knobs = steps[-1]
    smallest = min(candidates)
    est = price(p, smallest, knobs)
    return FitSolution(
        smallest, p.samples_per_device // smallest, knobs, est, False, names, {}, smallest % p.tensor_multiple == 0, est.reserved_peak_bytes
    )


def _prune(p: FitProblem, batch: int, names: tuple[str, ...], knobs: Knobs) -> tuple[tuple[str, ...], Knobs]:
    """Drop savers the chosen batch fits without (the last one added is needed, except on an
    offload step: the ladder turns every saver on there, so any of them may be superfluous)."""
    offload = knobs.sharding.offload_optimizer or knobs.sharding.offload_params
    for name in names if offload else names[:-1]:
        without = _undo(name, knobs, p.fixed)
        if fits_in_memory(price(p, batch, without), p, batch, without):
            names = tuple(n for n in names if n != name)
            knobs = without
    return names, knobs


def _undo(name: str, knobs: Knobs, fixed: Knobs) -> Knobs:
    """The knobs without one saver: its knob back to the spec's value."""
    knob = BY_NAME[name].knob
    return dataclasses.replace(knobs, **{knob: getattr(fixed, knob)})


def tensor_core_multiple(gpu: GPUProfile, half: bool, tf32: bool) -> int:
    """Batch multiple for tensor-core-friendly GEMM shapes.

    NVIDIA "Matrix Multiplication Background" / "Tensor Core Requirements": 16-bit
    dimensions in multiples of 8 (of 64 on A100, as the HF guide states), TF32 in
    multiples of 4; fp32 without TF32 does not use tensor cores (1).
    """
    if gpu.is_cpu:
        return 1
    if half:
        return 64 if gpu.compute_capability == (8, 0) else 8
    if tf32:
        return 4
    return 1


def batch_multiple(gemm_multiple: int, seq_len: int) -> int:
    """The per-device batches whose tokens per micro-batch are a multiple of gemm_multiple.

    In a transformer the batch enters every linear layer's GEMM as batch x seq_len rows
    (the hidden and vocabulary sizes are the other dimensions), and apply packs or pads
    every sequence to seq_len (apply/data/prepare.py), so batch x seq_len is the GEMM dimension:
    it is a multiple of m exactly when batch is a multiple of m / gcd(m, seq_len).
    """
    return gemm_multiple // math.gcd(gemm_multiple, seq_len)
