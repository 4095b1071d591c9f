"""`gpuplan apply`: plan (or load a saved plan), show it, confirm, then execute it.

As in Terraform: on a terminal it asks; without a terminal it needs --yes. What happens to
the output directory and how the processes start is apply/launch/session.py and apply/launch/backends.py.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuplan.cli.common import detect_hardware, make_plan, style_for
from gpuplan.errors import Diagnostic, GpuplanError, UserError
from gpuplan.plan.types import Plan
from gpuplan.render.style import Style
from gpuplan.render.text import render_plan


class ApplyRefused(UserError):
    """The user (or the lack of a terminal) declined: exit 1, nothing trained."""


def load_target(target: str, args, make_plan: Callable[[str, Any], Plan], detect) -> Plan:
    """A spec is planned now; a saved plan (JSON) is read as it was printed, and refused if stale."""
    from gpuplan.cli.state import check_saved_plan

    path = Path(target)
    if path.suffix == ".json":
        try:
            plan = Plan.from_dict(json.loads(path.read_text()))
            if getattr(args, "in_job", False) and plan.resolved.launch.target == "skypilot" and not plan.hardware.is_cpu:
                plan = plan_for_this_gpu(path, plan, detect)
            # handed off to a cluster: the job's own apply (--in-job) checks the nodes' hardware and packages
            check_saved_plan(plan, detect, here=not plan.resolved.launch.remote or bool(getattr(args, "in_job", False)))
            return plan
        except FileNotFoundError:
            raise GpuplanError([Diagnostic("error", None, f"{path}: no such file")]) from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise GpuplanError(
                [
                    Diagnostic(
                        "error",
                        None,
                        f"{path}: not a gpuplan plan ({type(e).__name__}: {e})",
                        fix="write one with `gpuplan plan SPEC --out run.plan.json`",
                    )
                ]
            ) from None
    return make_plan(target, args)


def plan_for_this_gpu(path: Path, plan: Plan, detect) -> Plan:
    """A SkyPilot job lists several GPU types, each with its plan beside the job's (clusters/accelerators.py):
    on a node whose GPU is not the plan's, the plan made for that GPU (plan.<GPU>.json) where the job has one."""
    from gpuplan.clusters.job import plan_for_gpu

    here = detect().name
    other = Path(plan_for_gpu(str(path), str(here)))
    if here == plan.hardware.name or not other.is_file():
        return plan  # the stale-plan check names the mismatch
    print(f"gpuplan: this node has {here}; applying the job's plan for it, {other}")
    return Plan.from_dict(json.loads(other.read_text()))


def check_remote_code(plan: Plan, flag: bool) -> None:
    """trust_remote_code runs code from the model directory: it needs the spec AND the flag."""
    if plan.resolved.model.trust_remote_code and not flag:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "model.trust_remote_code",
                    "model.trust_remote_code = true runs Python code shipped with the model; apply needs --trust-remote-code too",
                    fix="read the model's code, then run gpuplan apply ... --trust-remote-code",
                )
            ]
        )


def confirm(
    yes: bool, ask: Callable[[str], str] = input, isatty: Callable[[], bool] = sys.stdin.isatty, what: str = "Train with this plan?"
) -> None:
    if yes:
        return
    if not isatty():
        raise ApplyRefused("no terminal to confirm on", fix="run `gpuplan apply ... --yes` to go ahead without asking")
    answer = ask(f"{what} Only 'yes' will be accepted: ")
    if answer.strip() != "yes":
        raise ApplyRefused("apply cancelled")


def run_apply(args, *, make_plan: Callable[[str, Any], Plan], style: Style, detect) -> int:
    """Plan or load, show, confirm, train (apply/launch/session.py). Errors propagate: cli/main.py
    turns them into exit codes."""
    from gpuplan.apply.launch.session import apply_plan

    plan = load_target(args.target, args, make_plan, detect)
    check_remote_code(plan, args.trust_remote_code)
    if plan.resolved.launch.remote and not getattr(args, "in_job", False):
        from gpuplan.clusters.handoff import hand_off

        sys.stdout.write(render_plan(plan.to_dict(), style))
        return hand_off(plan, target=args.target, dry_run=args.dry_run, confirm=lambda: confirm(args.yes, what="Submit this job?"))
    if getattr(args, "dry_run", False):
        raise UserError(
            '--dry-run writes a cluster job, and launch.target = "local" trains here',
            fix="set [launch] target (slurm, kubernetes, skypilot or ray), or see what would run with: gpuplan plan SPEC",
        )
    from gpuplan.render.notices import log_to

    # library notices wait in memory: the run names its debug log in output.dir once it starts (apply/train/execute.py),
    # so an apply refused before that (a GPU plan on a CPU) leaves no gpuplan-debug.log behind
    log_to(None, load_libraries=True)
    sys.stdout.write(render_plan(plan.to_dict(), style))
    return apply_plan(
        plan,
        target=args.target,
        node_rank=getattr(args, "node_rank", None),
        env=os.environ,
        restart=args.restart,
        break_lock=args.break_lock,
        confirm=lambda: confirm(args.yes),
    )


def cmd_apply(args) -> int:
    return run_apply(args, make_plan=make_plan, style=style_for(args, sys.stdout), detect=detect_hardware)
