"""`gpuplan apply`: plan (or load a saved plan), show it, confirm, then execute it.

As in Terraform: on a terminal it asks; without a terminal it needs --yes.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

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
            check_saved_plan(plan, detect)
            return plan
        except FileNotFoundError:
            raise GpuplanError([Diagnostic("error", None, f"{path}: no such file")]) from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise GpuplanError([Diagnostic("error", None, f"{path}: not a gpuplan plan ({type(e).__name__}: {e})",
                                        fix="write one with `gpuplan plan SPEC --out run.plan.json`")]) from None
    return make_plan(target, args)


def check_remote_code(plan: Plan, flag: bool) -> None:
    """trust_remote_code runs code from the model directory: it needs the spec AND the flag."""
    if plan.get("model.trust_remote_code") and not flag:
        raise GpuplanError([Diagnostic(
            "error", "model.trust_remote_code",
            "model.trust_remote_code = true runs Python code shipped with the model; apply needs --trust-remote-code too",
            fix="read the model's code, then run gpuplan apply ... --trust-remote-code")])


def confirm(yes: bool, ask: Callable[[str], str] = input, isatty: Callable[[], bool] = sys.stdin.isatty) -> None:
    if yes:
        return
    if not isatty():
        raise ApplyRefused("no terminal to confirm on", fix="run `gpuplan apply ... --yes` to train without asking")
    answer = ask("Train with this plan? Only 'yes' will be accepted: ")
    if answer.strip() != "yes":
        raise ApplyRefused("apply cancelled")


def latest_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint (gpuplan-checkpoint.json, every file at its size:
    apply/checkpoints.py). Incomplete ones (killed while saving) are skipped; a corrupt
    one newer than it is refused, since resuming past it would silently lose steps."""
    from gpuplan.apply.checkpoints import find_resumable

    ckpt, _, corrupt = find_resumable(output_dir)
    if corrupt:
        d, problem = corrupt[0]
        raise GpuplanError([Diagnostic(
            "error", "output.dir", f"checkpoint {d} is {problem}",
            fix=f"rerun with --restart to train from the start, or delete {d} "
                "to resume from the checkpoint before it")])
    return ckpt


def set_aside_incomplete(output_dir: str) -> list[str]:
    """Rename checkpoints the last apply did not finish saving (never resumed, never deleted)."""
    from gpuplan.apply.checkpoints import find_resumable, set_aside

    return set_aside(find_resumable(output_dir)[1])


def supersede_checkpoints(output_dir: str) -> str | None:
    """--restart: move old checkpoints aside (never delete a user's run)."""
    old = sorted(Path(output_dir).glob("checkpoint-*"))
    if not old:
        return None
    dest = Path(output_dir) / f"superseded-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    dest.mkdir()
    for d in old:
        d.rename(dest / d.name)
    return str(dest)


def resume_point(plan: Plan, restart: bool) -> tuple[str | None, str]:
    """(checkpoint to resume from, what will happen) for this plan's output dir."""
    from gpuplan.lifecycle.state import load_state
    from gpuplan.lifecycle.drift import resume_conflicts

    out = plan.value("output.dir")
    state = load_state(out)
    if restart:
        return None, "--restart: training from the start (old checkpoints are moved aside, not deleted)"
    if state is None:
        return None, "new run"
    conflicts = resume_conflicts(state["plan"], plan.to_dict())
    ckpt = latest_checkpoint(out)
    if conflicts and ckpt:
        raise GpuplanError([Diagnostic(
            "error", "output.dir",
            f"{out} holds a run this plan cannot continue: " + "; ".join(conflicts),
            fix="use another output.dir, undo the change, or pass --restart to train from the start")])
    if ckpt is None:
        return None, f"previous apply ({state.get('status')}) left no checkpoint: training from the start"
    return ckpt, f"resuming the {state.get('status')} run from {ckpt}"


def run_apply(args, *, make_plan: Callable[[str, Any], Plan], style: Style, detect) -> int:
    """Plan or load, confirm, train. Errors propagate: cli/main.py turns them into exit codes."""
    from gpuplan.lifecycle.run_lock import RunLock

    plan = load_target(args.target, args, make_plan, detect)
    check_remote_code(plan, args.trust_remote_code)
    sys.stdout.write(render_plan(plan.to_dict(), style))
    from gpuplan.apply import (
        launch as scale,  # several processes: torchrun per node (apply/launch.py)
    )

    multi = scale.decide(plan, getattr(args, "node_rank", None), os.environ)
    if multi is not None and (multi.print_only or multi.node_rank > 0):
        return _launch_other_node(plan, args, multi, scale)
    with RunLock(plan.value("output.dir"), break_stale=args.break_lock):
        resume_from, what = resume_point(plan, args.restart)
        print(what)
        confirm(args.yes)
        if args.restart and (moved := supersede_checkpoints(plan.value("output.dir"))):
            print(f"Moved the old checkpoints to {moved}")
        elif not args.restart and (partial := set_aside_incomplete(plan.value("output.dir"))):
            print(f"Set aside checkpoints the last apply did not finish saving: {', '.join(partial)}")
        from gpuplan.apply.run import execute

        if multi is not None:
            argv = scale.launch_command(plan, scale.save_launch_plan(plan), node_rank=0, env=os.environ,
                                        resume_from=resume_from, progress=sys.stderr.isatty())
            return scale.run_torchrun(argv)
        execute(plan, echo=print, progress=sys.stderr.isatty(), resume_from=resume_from)
    return 0


def _launch_other_node(plan: Plan, args, multi, scale) -> int:
    """Several nodes: print every node's command, or run node_rank > 0 (node 0 holds the run lock)."""
    path = scale.save_launch_plan(plan)
    if multi.print_only:
        print("\n".join(scale.node_commands(plan, path, args.target, os.environ)))
        return 0
    resume_from, what = resume_point(plan, args.restart)  # read-only here: node 0 decides and moves
    print(f"node {multi.node_rank}: {what}")
    confirm(args.yes)
    return scale.run_torchrun(scale.launch_command(plan, path, node_rank=multi.node_rank, env=os.environ,
                                                   resume_from=None if args.restart else resume_from))


def cmd_apply(args) -> int:
    return run_apply(args, make_plan=make_plan, style=style_for(args, sys.stdout), detect=detect_hardware)
