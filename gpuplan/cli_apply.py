"""`gpuplan apply`: plan (or load a saved plan), show it, confirm, then execute it.

As in Terraform: on a terminal it asks; without a terminal it needs --yes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from gpuplan.plan.types import Diagnostic, Plan, PlanError
from gpuplan.render.style import Style
from gpuplan.render.text import render_plan


class ApplyRefused(Exception):
    """The user (or the lack of a terminal) declined: exit 1, nothing trained."""


def load_target(target: str, args, make_plan: Callable[[str, Any], Plan]) -> Plan:
    """A spec is planned now; a saved plan (JSON) is read as it was printed."""
    path = Path(target)
    if path.suffix == ".json":
        try:
            return Plan.from_dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise PlanError([Diagnostic("error", None, f"{path}: no such file")]) from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PlanError([Diagnostic("error", None, f"{path}: not a gpuplan plan ({type(e).__name__}: {e})",
                                        fix="write one with `gpuplan plan SPEC --out run.plan.json`")]) from None
    return make_plan(target, args)


def check_remote_code(plan: Plan, flag: bool) -> None:
    """trust_remote_code runs code from the model directory: it needs the spec AND the flag."""
    if plan.get("model.trust_remote_code") and not flag:
        raise PlanError([Diagnostic(
            "error", "model.trust_remote_code",
            "model.trust_remote_code = true runs Python code shipped with the model; apply needs --trust-remote-code too",
            fix="read the model's code, then run gpuplan apply ... --trust-remote-code")])


def confirm(yes: bool, ask: Callable[[str], str] = input, isatty: Callable[[], bool] = sys.stdin.isatty) -> None:
    if yes:
        return
    if not isatty():
        raise ApplyRefused("no terminal to confirm on: run `gpuplan apply ... --yes` to train without asking")
    answer = ask("Train with this plan? Only 'yes' will be accepted: ")
    if answer.strip() != "yes":
        raise ApplyRefused("apply cancelled")


def run_apply(args, *, make_plan: Callable[[str, Any], Plan], style: Style) -> int:
    from gpuplan.apply.errors import ApplyError

    plan = load_target(args.target, args, make_plan)
    check_remote_code(plan, args.trust_remote_code)
    sys.stdout.write(render_plan(plan.to_dict(), style))
    try:
        confirm(args.yes)
    except ApplyRefused as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    from gpuplan.apply.run import execute

    try:
        execute(plan, echo=print, progress=sys.stderr.isatty())
    except ApplyError as e:
        print(f"Error: {e.message}", file=sys.stderr)
        return 1
    return 0
