"""One error model for every user-facing failure: diagnostics with key, summary, detail and fix.

A `Diagnostic` is a problem or remark as the plan reports it. `GpuplanError` carries
every problem found (a spec with three bad keys reports three); the subclasses name
where a failure came from (ApplyError, LockError, UserError) but carry the same
fields, so the CLI reports them all one way and maps them to exit code 1 in one place
(gpuplan/cli/main.py). The best errors give the smallest fix (axolotl's "Smallest fix"),
and a library's refusal is translated into what to do next (accelerate's estimate.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Diagnostic:
    """A problem or remark, reported once with the smallest fix."""

    severity: Severity
    key: str | None  # key path such as "training.fp16", or None for the whole spec
    summary: str
    detail: str | None = None
    fix: str | None = None
    # The spec values `fix` sets, as data ({"training.effective_batch_size": 16}): what init
    # applies to a starter spec, so nothing reads them back out of the fix's words.
    fix_values: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "severity": self.severity,
            "key": self.key,
            "summary": self.summary,
            "detail": self.detail,
            "fix": self.fix,
        }
        return out if self.fix_values is None else {**out, "fix_values": dict(self.fix_values)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Diagnostic:
        return cls(d["severity"], d.get("key"), d["summary"], d.get("detail"), d.get("fix"), d.get("fix_values"))

    @property
    def message(self) -> str:
        """Summary, detail and fix on one line (run state files, worker stderr)."""
        return "; ".join(x for x in (self.summary, self.detail, self.fix) if x)


class GpuplanError(Exception):
    """A failure the user can fix, with every diagnostic collected (exit code 1, no traceback)."""

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("; ".join(d.message for d in self.diagnostics))

    @staticmethod
    def one(summary: str, *, key: str | None = None, detail: str | None = None, fix: str | None = None) -> GpuplanError:
        """An error with a single diagnostic."""
        return GpuplanError([Diagnostic("error", key, summary, detail, fix)])

    # The first diagnostic's fields: for the one-problem errors most raisers have.
    @property
    def key(self) -> str | None:
        return self.diagnostics[0].key

    @property
    def summary(self) -> str:
        return self.diagnostics[0].summary

    @property
    def detail(self) -> str | None:
        return self.diagnostics[0].detail

    @property
    def fix(self) -> str | None:
        return self.diagnostics[0].fix

    @property
    def message(self) -> str:
        return str(self)

    def diagnostic(self, **fields: Any) -> Diagnostic:
        """The first diagnostic, with `fields` (key, summary, fix ...) replaced: a boundary that
        knows more (which spec key was being read) says so without re-wording the error."""
        return dataclasses.replace(self.diagnostics[0], **fields)


class OneProblem(GpuplanError):
    """Base of the errors raised for a single problem: summary first, the rest by name.

    The library-level errors (the catalog's, the Hub's, the lock file's, a model config's,
    a user file's) are of this kind too, so every failure reaches the CLI as a GpuplanError."""

    def __init__(self, summary: str, *, key: str | None = None, detail: str | None = None, fix: str | None = None):
        super().__init__([Diagnostic("error", key, summary, detail, fix)])


class UserError(OneProblem):
    """A CLI-level mistake: a bad flag combination, no terminal to confirm on, a file that cannot be written."""


class ApplyError(OneProblem):
    """A user-fixable failure while applying a plan: bad file, field, weights or device."""


class LockError(OneProblem):
    """The output directory is in use by another apply (gpuplan/lifecycle/run_lock.py)."""
