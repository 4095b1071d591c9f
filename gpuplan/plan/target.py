"""Which machine a plan is for, and what this machine's facts may decide (issue 11 item 16).

A plan is for *this* machine when hardware.gpu is "auto" (detected here) or "cpu" (this
host) on one node. Then what is installed here, its cores and its RAM are the target's.
A plan for a named GPU or for several nodes is for another machine: what is installed
here says nothing about it, so a requested package is kept and the plan says it must be
installed there; cores and host RAM come from hardware.cpu_count / host_memory_gib.
"""

from __future__ import annotations

from typing import Any, Callable


def is_local(spec: Callable[[str], Any]) -> bool:
    """Whether the plan targets the machine that plans (see the module docstring)."""
    return spec("hardware.gpu") in ("auto", "cpu") and spec("hardware.nodes") == 1


def has_package(spec: Callable[[str], Any], environment: dict, package: str) -> bool:
    """A package counts as present if it is installed here, or the plan is for another machine."""
    return bool(environment.get("packages", {}).get(package)) or not is_local(spec)


def install_note(ctx, key: str, package: str, what: str) -> None:
    """Say that the target needs `package` when this machine lacks it (a plan for elsewhere)."""
    if not ctx.environment.get("packages", {}).get(package):
        ctx.note(key, f"{what} needs the {package} package on the training machines (not installed where this plan was made)",
                 fix=f"pip install {package} on every node before `gpuplan apply`")
