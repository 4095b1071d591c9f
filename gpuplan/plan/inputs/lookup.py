"""The inputs a plan looks up: the GPU profile (the catalog, or detection at the CLI edge) and the
model's facts (its config.json, from a path or the Hub snapshot the plan pinned)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from gpuplan.hardware.catalog import AmbiguousGPUError, UnknownGPUError, lookup
from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo import ModelConfigError, model_facts, read_config
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.types import Diagnostic, PlanError, Setting
from gpuplan.spec.schema import Spec
from gpuplan.units import GIB


def resolve_gpu(spec: Spec, detect: Callable[[], GPUProfile] | None) -> GPUProfile:
    """The spec's GPU from the catalog; "auto" calls `detect` (the CLI edge), only then."""
    hw = spec.hardware
    try:
        if hw.gpu == "auto":
            detected = detect() if detect is not None else None
            if detected is None:
                raise PlanError(
                    [
                        Diagnostic(
                            "error",
                            "hardware.gpu",
                            'hardware.gpu = "auto" but no device was detected',
                            fix='set hardware.gpu to a catalog name such as "A100-80GB"',
                        )
                    ]
                )
            gpu = detected
            if hw.memory_gib is not None:
                gpu = dataclasses.replace(gpu, memory_bytes=int(hw.memory_gib * GIB))
            return gpu
        gpu = lookup(hw.gpu, hw.memory_gib)
        if gpu.is_cpu and hw.memory_gib is None:
            from gpuplan.hardware.detect import cpu_profile  # this host's RAM and cores: no torch

            gpu = cpu_profile()[0]
        return gpu
    except (UnknownGPUError, AmbiguousGPUError) as e:
        raise PlanError(
            [Diagnostic("error", "hardware.gpu", f"hardware.gpu = {hw.gpu!r}: {e}", fix="run `gpuplan gpus` for the catalog")]
        ) from None


def load_facts(settings: Mapping[str, Setting], spec: Spec, refs: Mapping[str, Any] | None = None) -> ModelFacts:
    src_key = "model.config" if settings["model.config"].value else "model.name_or_path"
    hub = (refs or {}).get(src_key)
    try:
        config = read_config(hub.path if hub is not None else settings[src_key].value)
        return _facts_of(config, spec.model.task, spec.model.num_labels or 2)
    except ModelConfigError as e:
        raise PlanError([Diagnostic("error", src_key, f"{src_key}: {e}")]) from None


# The facts of the configs planned in this process, by their content: a plan that does not fit plans the spec
# again on other hardware (plan/fit/hardware_alternatives.py), and `compare` plans it on every GPU; each gets the
# same record, so the estimate's caches keyed by it (plan/estimate/memory/layout.py) find it by identity.
_FACTS: dict[tuple[str, str, int], ModelFacts] = {}
_FACTS_KEPT = 64


def _facts_of(config: Mapping[str, Any], task: str, num_labels: int) -> ModelFacts:
    try:
        key = (json.dumps(config, sort_keys=True, allow_nan=True), task, num_labels)
    except (TypeError, ValueError):  # not JSON-like (a config built by hand): counted, not kept
        return model_facts(config, task, num_labels)
    facts = _FACTS.get(key)
    if facts is None:
        facts = model_facts(config, task, num_labels)
        if len(_FACTS) >= _FACTS_KEPT:
            _FACTS.pop(next(iter(_FACTS)))
        _FACTS[key] = facts
    return facts
