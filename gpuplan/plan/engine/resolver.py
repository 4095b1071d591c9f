"""The Resolver: the state a rule sees while the plan graph is walked.

Rules read through `get` / `spec` (checked against their declared reads) and write
through `derive` / `adjust`, which record a Change with the rule id and reason.
An adjustment of a user-set value becomes an error under --strict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.engine.graph import SPEC, Node, Rule
from gpuplan.plan.inputs.environment import Environment
from gpuplan.plan.types import Change, Diagnostic, Setting
from gpuplan.toml_value import toml_value

T = TypeVar("T")


@dataclass
class Resolver:
    spec_settings: dict[str, Setting]  # key -> value as the spec gives it (user or default)
    gpu: GPUProfile
    facts: ModelFacts
    strict: bool = False
    environment: Environment = field(default_factory=Environment)  # this machine: packages, cores, RAM
    resolved: dict[str, Setting] = field(default_factory=dict)
    internal: dict[str, Any] = field(default_factory=dict)  # non-setting nodes such as "internal:fit.solution"
    changes: list[Change] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    written_by: dict[str, str] = field(default_factory=dict)  # key -> rule id, for the whole rule set
    done: set[str] = field(default_factory=set)  # ids of rules already run
    rule: Rule | None = None  # the rule running now
    # A plan that answers only "does it fit?" (the hardware alternatives probe other GPUs with
    # it): a memory fit that fails reports its error without searching for the fixes.
    probe: bool = False

    # ---- reading ---------------------------------------------------------------
    def _check_read(self, name: str) -> None:
        if self.rule is not None and name not in self.rule.reads and name not in self.rule.writes:
            raise AssertionError(f"rule {self.rule.id} reads {name} without declaring it")

    def spec(self, key: str) -> Any:
        """The spec's value for key (user-set or default)."""
        self._check_read(SPEC + key)
        return self.spec_settings[key].value

    def is_user(self, key: str) -> bool:
        """Whether the user wrote this key in the spec (and not as "auto")."""
        s = self.spec_settings.get(key)
        return s is not None and s.source == "user" and s.value != "auto"

    @overload
    def get(self, key: Node[T]) -> T: ...

    @overload
    def get(self, key: str) -> Any: ...

    def get(self, key: str) -> Any:
        """The resolved value of key: its writer has run, or no rule writes it."""
        self._check_read(key)
        writer = self.written_by.get(key)
        if writer is not None and writer not in self.done and (self.rule is None or writer != self.rule.id):
            raise AssertionError(f"{key} read before its writer {writer} ran")
        if key in self.internal:
            return self.internal[key]
        s = self.resolved.get(key) or self.spec_settings.get(key)
        if s is None:
            raise KeyError(key)
        return s.value

    def get_or_none(self, key: str) -> Any:
        """The value already resolved for key in this walk, else None (no ordering implied)."""
        s = self.resolved.get(key)
        return None if s is None else s.value

    # ---- writing ---------------------------------------------------------------
    def _check_write(self, key: str) -> str:
        assert self.rule is not None and key in self.rule.writes, f"undeclared write of {key}"
        return self.rule.id

    def set_internal(self, key: Node[T], value: T) -> None:
        self._check_write(key)
        self.internal[key] = value

    def resolve(self, key: str, value: Any, reason: str | None = None, rule: str | None = None) -> None:
        """Write the resolved value. A change from the spec value is recorded with `reason`.

        `rule` names a finer rule id for the Change (e.g. batch.tensor_core_multiple
        inside batch.split); it defaults to the running rule's id.
        """
        rule_id = self._check_write(key)
        if rule is not None:
            assert self.rule is not None and (rule == rule_id or rule in self.rule.explains), (
                f"rule {rule_id} records {rule} without declaring it"
            )
            rule_id = rule
        before = self.spec_settings[key]
        if value == before.value and type(value) is type(before.value):
            self.resolved[key] = before
            return
        if reason is None:
            raise AssertionError(f"rule {rule_id} changed {key} without a reason")
        if before.source == "user" and before.value != "auto":
            if self.strict:
                self.error(
                    key,
                    f"{key} = {before.value!r} would be changed to {value!r} (--strict): {reason}",
                    fix=(
                        f"set {key} = {toml_value(value)} or drop --strict"
                        if value is not None
                        else f"remove {key} from the spec or drop --strict"
                    ),
                )
                self.resolved[key] = before
                return
            self.resolved[key] = Setting(value, "adjusted", reason, rule_id)
            self.changes.append(Change("change", key, before.value, value, rule_id, reason))
        else:
            self.resolved[key] = Setting(value, "derived", reason, rule_id)
            self.changes.append(Change("add", key, before.value, value, rule_id, reason))

    def keep(self, key: str) -> None:
        """The rule looked at key and leaves the spec value as it is."""
        self._check_write(key)
        self.resolved[key] = self.spec_settings[key]

    # ---- diagnostics -----------------------------------------------------------
    def error(self, key: str | None, summary: str, detail: str | None = None, fix: str | None = None) -> None:
        self.diagnostics.append(Diagnostic("error", key, summary, detail, fix))

    def warn(self, key: str | None, summary: str, detail: str | None = None, fix: str | None = None) -> None:
        self.diagnostics.append(Diagnostic("warning", key, summary, detail, fix))

    def note(self, key: str | None, summary: str, detail: str | None = None, fix: str | None = None) -> None:
        self.diagnostics.append(Diagnostic("note", key, summary, detail, fix))

    @property
    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)
