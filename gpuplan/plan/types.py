"""The plan as data: settings with provenance, changes, diagnostics.

Like Terraform's internal/plans, these types carry no behaviour beyond
(de)serialisation. The `reason` of a Setting or Change is for people: the
executor must not branch on it, only on `value`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpuplan.errors import Diagnostic, GpuplanError, Severity
from gpuplan.plan.resolved import Resolved, resolve_settings
from gpuplan.plan.sections import HardwareSection, MemorySection, ModelSection, ThroughputSection

FORMAT_VERSION = 1

__all__ = ["FORMAT_VERSION", "Change", "Diagnostic", "Plan", "PlanError", "Setting", "Severity", "Source"]

Source = Literal["user", "default", "derived", "adjusted"]


@dataclass(frozen=True)
class Setting:
    """One resolved value and where it came from."""

    value: Any
    source: Source
    reason: str | None = None
    rule: str | None = None  # id of the rule that wrote it; None for user/default

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "reason": self.reason, "rule": self.rule}


@dataclass(frozen=True)
class Change:
    """A value gpuplan set ("add": the user left it to gpuplan) or changed ("change")."""

    action: Literal["add", "change"]
    key: str
    before: Any
    after: Any
    rule: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "key": self.key,
            "before": self.before,
            "after": self.after,
            "rule": self.rule,
            "reason": self.reason,
        }


# The error model is gpuplan.errors; PlanError is its name where a plan is refused.
PlanError = GpuplanError


@dataclass(frozen=True)
class Plan:
    """A resolved plan: everything `apply` needs, nothing it must re-derive.

    `settings` maps full key paths ("training.per_device_train_batch_size") to
    Settings. `hardware`, `model`, `memory` and `throughput` are the typed sections
    of gpuplan.plan.sections, so a saved plan round-trips exactly. `resolved` is the
    settings' values as typed sections (gpuplan.plan.resolved), built here from `settings`
    (so a loaded plan.json gets them too) and never serialised: apply, after and trace read
    `plan.resolved.training.seed`, not `plan.value("training.seed")`.
    """

    spec_path: str | None
    spec_sha256: str | None
    hardware: HardwareSection
    model: ModelSection
    settings: Mapping[str, Setting]
    changes: tuple[Change, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = ()
    memory: MemorySection = field(default_factory=MemorySection)
    throughput: ThroughputSection = field(default_factory=ThroughputSection)
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    resolved: Resolved = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        warmup = self.settings.get("training.warmup_steps")
        values = {k: s.value for k, s in self.settings.items()}
        resolved = resolve_settings(values, warmup_derived=warmup is not None and warmup.source == "derived")
        object.__setattr__(self, "resolved", resolved)

    def value(self, key: str) -> Any:
        """The resolved value of a key path; KeyError names the key."""
        return self.settings[key].value

    def get(self, key: str, default: Any = None) -> Any:
        s = self.settings.get(key)
        return default if s is None else s.value

    def adjusted(self, values: Mapping[str, Any], *, reason: str, rule: str) -> Plan:
        """This plan with `values` ({key path: value}) in place of its settings' values, each marked
        as adjusted by `rule` with `reason` (apply's re-plan after running out of memory)."""
        settings = dict(self.settings)
        for key, value in values.items():
            settings[key] = replace(self.settings[key], value=value, source="adjusted", reason=reason, rule=rule)
        return replace(self, settings=settings)

    def with_settings(self, values: Mapping[str, Setting]) -> Plan:
        """This plan with `values` ({key path: Setting}) added or in place of its settings."""
        return replace(self, settings={**self.settings, **values})

    @property
    def world_size(self) -> int:
        """Processes the plan runs as: hardware.count per node x hardware.nodes (its settings)."""
        return self.resolved.hardware.world_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "spec_path": self.spec_path,
            "spec_sha256": self.spec_sha256,
            "hardware": self.hardware.to_dict(),
            "model": self.model.to_dict(),
            "settings": {k: s.to_dict() for k, s in sorted(self.settings.items())},
            "changes": [c.to_dict() for c in self.changes],
            "diagnostics": [d.to_dict() for d in self.diagnostics],
            "memory": self.memory.to_dict(),
            "throughput": self.throughput.to_dict(),
            "fingerprint": dict(self.fingerprint),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        return cls(
            spec_path=d.get("spec_path"),
            spec_sha256=d.get("spec_sha256"),
            hardware=HardwareSection.from_dict(d.get("hardware") or {}),
            model=ModelSection.from_dict(d.get("model") or {}),
            settings={k: Setting(v["value"], v["source"], v.get("reason"), v.get("rule")) for k, v in d["settings"].items()},
            changes=tuple(Change(c["action"], c["key"], c["before"], c["after"], c["rule"], c["reason"]) for c in d.get("changes", [])),
            diagnostics=tuple(Diagnostic.from_dict(x) for x in d.get("diagnostics", [])),
            memory=MemorySection.from_dict(d.get("memory") or {}),
            throughput=ThroughputSection.from_dict(d.get("throughput") or {}),
            fingerprint=d.get("fingerprint", {}),
            format_version=d.get("format_version", FORMAT_VERSION),
        )
