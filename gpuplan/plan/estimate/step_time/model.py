"""A training step's time from its terms, combined phase by phase (roofline).

Why this combination. A GPU runs one kernel at a time per stream, so the work of one
micro-batch on the device is the SUM of its kernels' times, and each matmul pass takes
the longer of its FLOPs at the achievable rate and its weight reads over the bandwidth
(the roofline: Williams, Waterman and Patterson 2009). Eager PyTorch launches kernels
asynchronously: the host's launch cost overlaps the device's work, so a micro-batch
takes max(device work, host launch time); small micro-batches of a large layer count
are launch-bound (Qwen README: "~1.0 s/it" rows). Collectives run on their own stream
beside compute (plan/estimate/comm_time.py): max() again. Serial terms (ZeRO-3 hooks,
CPU offload copies, the optimizer step, the Trainer's per-step work) add. So

    micro-batch = max(device, host, link_per_micro_batch) + serial_per_micro_batch
    step        = accumulation x micro-batch + per-step serial terms
                  + max(0, all-reduce - one micro-batch's backward)

On a CPU one processor does the launching and the work: everything adds.

Each term's share of the step is its EXPOSED time: device terms in full; host, link
and overlapped terms only by what outlasts the work they overlap. The shares add up
to the step. `extra` terms (memory savers, sharded adapters...) are appended by
whoever models them; a "serial" one adds, an overlapping one is combined as above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan.hardware.catalog import load_catalog
from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate import comm_time  # the module, not its names: comm_time imports this package (a cycle)
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.shape import build_shape
from gpuplan.plan.estimate.step_time.terms import (
    Term,
    attention_terms,
    fixed_terms,
    matmul_terms,
    memory_terms,
    optimizer_terms,
)

GROUPS = ("matmuls", "attention", "memory-bound", "optimizer", "fixed costs", "communication", "offload")
WORK_KINDS = ("device",)  # what a calibration's `work` scale multiplies; `fixed` scales host and serial


@dataclass(frozen=True)
class StepTime:
    step_s: float
    micro_batch_s: float
    terms: tuple[Term, ...]
    exposed: Mapping[str, float]  # term name -> seconds of the step it accounts for
    constants: K.ArchConstants
    scale: Mapping[str, float]

    def shares(self) -> dict[str, float]:
        """Fraction of the step per group, largest first."""
        by: dict[str, float] = {}
        for t in self.terms:
            by[t.group] = by.get(t.group, 0.0) + self.exposed.get(t.name, 0.0)
        return dict(sorted(((g, v / self.step_s) for g, v in by.items() if v > 0), key=lambda kv: -kv[1]))

    def bound(self) -> str:
        shares = self.shares()
        return next(iter(shares), "matmuls")

    def summary(self) -> str:
        return ", ".join(f"{g} {f:.0%}" for g, f in self.shares().items() if f >= 0.005)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": "step-time terms (plan/estimate/step_time)",
            "micro_batch_s": self.micro_batch_s,
            "terms": [{**t.to_dict(), "exposed_s": self.exposed.get(t.name, 0.0)} for t in self.terms],
            "shares": self.shares(),
            "bound_by": self.bound(),
            "summary": self.summary(),
            "arch_class": self.constants.name,
            "constants": {
                "matmul_efficiency": self.constants.matmul_efficiency,
                "kernel_s": self.constants.kernel_s,
                "trainer_step_s": self.constants.trainer_step()[0],
                "source": self.constants.source,
            },
            "scale": dict(self.scale),
            **(
                {
                    "calibrated_constants": {  # what the measured runs put in place of the class's fitted constants
                        "matmul_efficiency": self.constants.matmul_efficiency / self.scale.get("work", 1.0),
                        "kernel_s": self.constants.kernel_s * self.scale.get("fixed", 1.0),
                        "trainer_step_s": self.constants.trainer_step()[0] * self.scale.get("fixed", 1.0),
                    }
                }
                if self.scale
                else {}
            ),
        }


def scaled_term(t: Term, scale: Mapping[str, float]) -> Term:
    """`t` times a calibration's multiplier of its part: `work` for device terms, `fixed` for fixed costs."""
    k = scale.get("work", 1.0) if t.kind in WORK_KINDS else scale.get("fixed", 1.0) if t.group == "fixed costs" else 1.0
    return t if k == 1.0 else Term(t.name, t.group, t.seconds * k, t.per, t.kind, t.formula, t.source)


def combine(terms: Sequence[Term], accumulation: int, on_cpu: bool) -> tuple[float, float, dict[str, float]]:
    """(step s, micro-batch s, exposed s per term name) of the terms, as the docstring says."""
    mb = [t for t in terms if t.per == "micro-batch"]
    step_terms = [t for t in terms if t.per == "step"]
    exposed: dict[str, float] = {}

    def total(kind: str, ts: Sequence[Term]) -> float:
        return sum(t.seconds for t in ts if t.kind == kind)

    if on_cpu:
        for t in terms:
            exposed[t.name] = exposed.get(t.name, 0.0) + t.seconds * (accumulation if t.per == "micro-batch" else 1)
        micro = sum(t.seconds for t in mb)
        return micro * accumulation + sum(t.seconds for t in step_terms), micro, exposed
    device, host, link = total("device", mb), total("host", mb), total("link", mb)
    overlapped = max(device, host, link)
    micro = overlapped + total("serial", mb)

    def spread(kind: str, excess: float) -> None:
        ts = [t for t in mb if t.kind == kind]
        whole = sum(t.seconds for t in ts) or 1.0
        for t in ts:
            exposed[t.name] = exposed.get(t.name, 0.0) + accumulation * excess * t.seconds / whole

    spread("device", device)
    spread("host", max(0.0, host - device))
    spread("link", max(0.0, link - max(device, host)))
    spread("serial", total("serial", mb))
    step = micro * accumulation
    backward = device * 2 / 3  # the backward is about 2/3 of a micro-batch's device work (4N of 6N)
    for t in step_terms:
        e = max(0.0, t.seconds - backward) if t.kind == "link" else t.seconds
        exposed[t.name] = exposed.get(t.name, 0.0) + e
        step += e
    return step, micro, exposed


def step_time(
    facts: ModelFacts,
    wl: Workload,
    gpu: GPUProfile,
    *,
    compute_dtype: str,
    peak_tflops: float,
    comm: Mapping[str, Any] | None = None,
    constants: K.ArchConstants | None = None,
    scale: Mapping[str, float] | None = None,
    extra: Sequence[Term] = (),
) -> StepTime:
    """The step time of `wl` on one `gpu`, by term. `comm`: plan/estimate/comm_time.py's section;
    `constants`: the class's (default: the fitted ones); `scale`: a calibration's
    {"work": x, "fixed": y} multipliers; `extra`: more named terms to combine."""
    c = constants or K.constants_for(gpu, compute_dtype)
    s = build_shape(facts, wl, gpu, compute_dtype)
    peak = peak_tflops * 1e12
    bw = gpu.memory_bandwidth_gbps * 1e9 * (1.0 if s.on_cpu else K.HBM_FRACTION)
    host_bw = load_catalog()["cpu"].memory_bandwidth_gbps * 1e9
    shards = wl.shard_world_size if wl.zero_stage >= 1 else 1
    terms: list[Term] = [
        *matmul_terms(s, c, peak, bw),
        *attention_terms(s, c, peak, bw),
        *memory_terms(s, bw),
        *optimizer_terms(s, bw, shards, host_bw if (wl.offload_optimizer or wl.offload_params) else None),
        *fixed_terms(s, c, shards, wl.zero_stage if wl.engine == "deepspeed" else 0),
        *comm_time.communication_terms(comm, wl),
        *comm_time.offload_terms(s, wl, gpu, host_bw),
        *extra,
    ]
    scale = dict(scale or {})
    terms = [scaled_term(t, scale) for t in terms]
    step, micro, exposed = combine(terms, s.accumulation, s.on_cpu)
    return StepTime(step, micro, tuple(terms), exposed, c, scale)
