"""The candidates `gpuplan tune` times: the fit search's splits and savers, each planned in full.

DeepSpeed's autotuner is the model (deepspeed/autotuning: short experiments over micro-batch
sizes and ZeRO stages, the fastest kept). Here the space is the one the fit search walks
(plan/fit/search.py) at the plan's sharding layout:
  - every per-device batch that splits the samples per device exactly (the accumulation
    makes up the same effective batch), not below the trainer's smallest batch;
  - every combination of the memory savers the search may turn (fit/savers.py), gradient
    checkpointing on and off included; Adafactor is left out: it changes convergence, not
    only the step (the saver table's own words);
and only what fits the memory the search allows (the same estimate, the same headroom).
The fit search's order of preference (cheapest saver slowdown, then the larger batch) keeps
the first few; each is then planned in full from the spec with its settings set
(plan/build.py plan_spec: every rule, the step-time model, the calibrations), and the
fastest planned ones are the candidates. Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.build import plan_spec, resolve, with_overrides
from gpuplan.plan.fit.savers import ADAFACTOR_OPTIMIZER, SAVERS, SaverSpec
from gpuplan.plan.fit.search import FitProblem, Knobs, divisors, fits_in_memory, price
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION
from gpuplan.plan.types import Plan, PlanError
from gpuplan.spec.load import LoadedSpec

BATCH = "training.per_device_train_batch_size"
ACCUMULATION = "training.gradient_accumulation_steps"
# settings that do not change a step's time: a measurement made under other values of them still holds
NOT_THE_STEP = (
    "output.",
    "training.max_steps",
    "training.num_train_epochs",
    "training.save_",
    "training.logging_",
    "training.learning_rate",
    "training.seed",
)


@dataclass(frozen=True)
class Candidate:
    """One split and set of savers, as the spec keys that make the plan run it, and its plan."""

    per_device_batch: int
    accumulation: int
    savers: tuple[str, ...]  # the savers on, in the saver table's order
    settings: Mapping[str, Any]  # spec key -> value
    plan: Plan

    @property
    def label(self) -> str:
        return f"batch {self.per_device_batch} x {self.accumulation}" + (f" + {', '.join(self.savers)}" if self.savers else "")

    @property
    def fingerprint(self) -> str:
        """What a measurement of it stays valid for: its resolved settings, the hardware, the packages
        (plan/fingerprint.py), without what does not change a step (the run's length, where it
        writes, how often it logs and saves) and without the spec file's hash: tune rewrites the spec."""
        fp = self.plan.fingerprint or {}
        settings = {k: s.value for k, s in sorted(self.plan.settings.items()) if not k.startswith(NOT_THE_STEP)}
        body = {"settings": settings, "hardware": fp.get("hardware"), "versions": fp.get("versions")}
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tunable_savers(p: FitProblem, knobs: Knobs) -> list[SaverSpec]:
    """The savers tune may turn: those the search may (plus checkpointing, always), where they run."""
    out = []
    for s in SAVERS:
        if s is ADAFACTOR_OPTIMIZER or not s.available(p, knobs.sharding):
            continue
        if s.knob in p.auto or s.knob == "gradient_checkpointing":
            out.append(s)
    return out


def _off_value(s: SaverSpec, p: FitProblem) -> Any:
    off = getattr(p.fixed, s.knob)
    if off == s.value:  # the spec turned it on: off is the knob's default
        off = getattr(Knobs(gradient_checkpointing=False, optim="adamw_torch", torch_empty_cache_steps=0), s.knob)
    return off


def considered(p: FitProblem, knobs: Knobs) -> list[tuple[int, Knobs, tuple[str, ...]]]:
    """(per-device batch, knobs, savers on) of every split and saver set that fits, in the fit
    search's order of preference: the cheapest savers first, then the larger batch."""
    savers = tunable_savers(p, knobs)
    batches = [b for b in divisors(p.samples_per_device) if b >= p.min_batch] or divisors(p.samples_per_device)
    out = []
    for on in itertools.product((False, True), repeat=len(savers)):
        k = dataclasses.replace(knobs, **{s.knob: (s.value if flag else _off_value(s, p)) for s, flag in zip(savers, on)})
        names = tuple(s.name for s, flag in zip(savers, on) if flag)
        slowdown = sum(s.slowdown(p) for s, flag in zip(savers, on) if flag)
        for b in batches:
            if fits_in_memory(price(p, b, k), p, b, k):
                out.append((slowdown, -b, b, k, names))
    out.sort(key=lambda c: (c[0], c[1]))
    return [(b, k, names) for _, _, b, k, names in out]


def candidate_settings(p: FitProblem, batch: int, knobs: Knobs) -> dict[str, Any]:
    settings: dict[str, Any] = {BATCH: batch, ACCUMULATION: p.samples_per_device // batch}
    for s in SAVERS:
        if s is not ADAFACTOR_OPTIMIZER:
            settings[s.setting] = getattr(knobs, s.knob)
    return settings


def _overrides(settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in settings.items():
        section, name = key.split(".", 1)
        out.setdefault(section, {})[name] = value
    return out


def tune_candidates(
    loaded: LoadedSpec,
    *,
    detect: Callable[[], GPUProfile] | None,
    environment: Any,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
    top: int = 4,
    planned: int = 12,
) -> tuple[Plan, list[Candidate], list[str]]:
    """(the spec's own plan, the `top` fastest planned candidates, why others were dropped).

    The spec's plan raises PlanError as `gpuplan plan` does. `planned`: how many of the fit
    search's first candidates are planned in full before the fastest `top` are kept."""
    base = plan_spec(loaded, detect=detect, environment=environment, prices=prices, calibrations=calibrations)
    ctx = resolve(loaded, detect=detect, environment=environment)[4]
    p, sol = ctx.internal[FIT_PROBLEM], ctx.internal[FIT_SOLUTION]
    found: list[Candidate] = []
    dropped: list[str] = []
    seen: set[str] = set()
    for batch, knobs, names in considered(p, sol.knobs)[:planned]:
        settings = candidate_settings(p, batch, knobs)
        label = f"batch {batch} x {p.samples_per_device // batch}" + (f" + {', '.join(names)}" if names else "")
        try:
            plan = plan_spec(
                dataclasses.replace(loaded, raw=with_overrides(loaded.raw, _overrides(settings))),
                detect=detect,
                environment=environment,
                prices=prices,
                calibrations=calibrations,
                alternatives=False,
            )
        except PlanError as e:
            dropped.append(f"{label}: the plan refuses it ({e.diagnostics[0].summary})")
            continue
        if any(plan.value(k) != v for k, v in settings.items()):
            dropped.append(f"{label}: the plan runs other settings for it")
            continue
        if plan.throughput.tokens_per_second is None:
            dropped.append(f"{label}: no time estimate")
            continue
        c = Candidate(batch, p.samples_per_device // batch, names, settings, plan)
        if c.fingerprint not in seen:
            seen.add(c.fingerprint)
            found.append(c)
    found.sort(key=lambda c: -(c.plan.throughput.tokens_per_second or 0.0))
    dropped += [f"{c.label}: planned slower than the {top} fastest" for c in found[top:]]
    return base, found[:top], dropped
