"""Which machine a plan is for, and what this machine's facts may decide (issue 11 item 16).

A plan is for *this* machine when hardware.gpu is "auto" (detected here) or "cpu" (this
host) on one node. Then what is installed here, its cores and its RAM are the target's.
A plan for a named GPU or for several nodes is for another machine: what is installed
here says nothing about it, so a requested package is kept and the plan says it must be
installed there; cores and host RAM come from hardware.cpu_count / host_memory_gib.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuplan.plan.inputs.environment import Environment


def is_local(spec: Callable[[str], Any]) -> bool:
    """Whether the plan targets the machine that plans (see the module docstring)."""
    return spec("hardware.gpu") in ("auto", "cpu") and spec("hardware.nodes") == 1


class _OnTheTarget(dict):
    """Packages of a machine this plan cannot see: any package asked for counts as installed there."""

    def get(self, key, default=None):
        return super().get(key) or "on the target"


def target_packages(spec: Callable[[str], Any], environment: Environment) -> dict:
    """The packages explicit requests are checked against: this machine's when the plan is
    for it; otherwise any (apply there fails with the import error if one is missing, and
    the plan says what to install). Choices gpuplan makes itself ("auto") use only what
    is installed here, so a plan never depends on a package its maker does not have
    unless the spec asked for it."""
    packages = environment.packages
    return dict(packages) if is_local(spec) else _OnTheTarget(packages)


def install_note(ctx, key: str, package: str, what: str) -> None:
    """Say that the target needs `package` when this machine lacks it (a plan for elsewhere)."""
    if not ctx.environment.has(package):
        ctx.note(
            key,
            f"{what} needs the {package} package on the training machines (not installed where this plan was made)",
            fix=f"pip install {package} on every node before `gpuplan apply`",
        )
