"""One apply of a plan, around its launcher: the run lock, where to resume, old checkpoints.

The CLI parses, renders the plan, and hands `apply_plan` a `confirm` callback; this module
decides what happens to the output directory and starts the launcher (apply/launch/backends.py).
The node that holds the run (one process, or node 0) takes the run lock, decides the resume
point and moves old checkpoints; another node only reads the resume point and joins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from gpuplan.apply.launch.backends import Launcher, launcher_for
from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.lifecycle.run_dir import CHECKPOINT_PREFIX, STATE_FILE
from gpuplan.plan.types import Plan


def latest_checkpoint(output_dir: str, *, on_bucket: bool = False) -> str | None:
    """The newest complete checkpoint (gpuplan-checkpoint.json, every file at its size:
    apply/train/checkpoints.py). Incomplete ones (killed while saving; on a write-back bucket,
    `on_bucket`, also those not fully uploaded) are skipped; a corrupt one newer than it is
    refused, since resuming past it would silently lose steps."""
    from gpuplan.apply.train.checkpoints import find_resumable

    ckpt, _, corrupt = find_resumable(output_dir, on_bucket=on_bucket)
    if corrupt:
        d, problem = corrupt[0]
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "output.dir",
                    f"checkpoint {d} is {problem}",
                    fix=f"rerun with --restart to train from the start, or delete {d} to resume from the checkpoint before it",
                )
            ]
        )
    return ckpt


def set_aside_incomplete(output_dir: str, *, on_bucket: bool = False) -> list[str]:
    """Rename checkpoints the last apply did not finish saving (or, `on_bucket`, uploading): never resumed, never deleted."""
    from gpuplan.apply.train.checkpoints import find_resumable, set_aside

    return set_aside(find_resumable(output_dir, on_bucket=on_bucket)[1])


def set_aside_lines(output_dir: str, *, on_bucket: bool) -> list[str]:
    """Set the unfinished checkpoints aside; what to say about each (nothing when there are none)."""
    from gpuplan.apply.train.checkpoints import checkpoint_problem, find_resumable, set_aside

    partial = find_resumable(output_dir, on_bucket=on_bucket)[1]
    if not partial:
        return []
    problems = [checkpoint_problem(d) for d in partial]
    moved = set_aside(partial)
    if not on_bucket:
        return [f"Set aside checkpoints the last apply did not finish saving: {', '.join(moved)}"]
    return [
        f"Set aside {d} ({problem}): the last apply did not finish saving or uploading it to the bucket "
        f"(launch.storage_bucket, write-back), now {new}"
        for d, problem, new in zip(partial, problems, moved)
    ]


def supersede_checkpoints(output_dir: str) -> str | None:
    """--restart: move old checkpoints aside (never delete a user's run)."""
    old = sorted(Path(output_dir).glob(CHECKPOINT_PREFIX + "*"))
    if not old:
        return None
    dest = Path(output_dir) / f"superseded-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    dest.mkdir()
    for d in old:
        d.rename(dest / d.name)
    return str(dest)


def resume_point(plan: Plan, restart: bool) -> tuple[str | None, str]:
    """(checkpoint to resume from, what will happen) for this plan's output dir."""
    from gpuplan.lifecycle.drift import resume_conflicts
    from gpuplan.lifecycle.state import load_state

    out = plan.resolved.output.dir
    state = load_state(out)
    if restart:
        return None, "--restart: training from the start (old checkpoints are moved aside, not deleted)"
    if state is None:
        if plan.resolved.launch.on_bucket and (ckpt := latest_checkpoint(out, on_bucket=True)):
            # rclone uploads a file once it has not changed for a while (--vfs-write-back, 5 s): the state, rewritten
            # every step, may never have reached the bucket when the VM stopped, while the checkpoints did
            return ckpt, f"resuming from {ckpt}: the run's {STATE_FILE} had not reached the bucket when its VM stopped"
        return None, "new run"
    conflicts = resume_conflicts(Plan.from_dict(state["plan"]), plan)
    ckpt = latest_checkpoint(out, on_bucket=plan.resolved.launch.on_bucket)
    if conflicts and ckpt:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "output.dir",
                    f"{out} holds a run this plan cannot continue: " + "; ".join(conflicts),
                    fix="use another output.dir, undo the change, or pass --restart to train from the start",
                )
            ]
        )
    if ckpt is None and state.get("status") == "submitted":  # handed off to a cluster, and this is the job starting
        return None, f"new run (the {(state.get('job') or {}).get('target')} job submitted {(state.get('job') or {}).get('submitted_at')})"
    if ckpt is None:
        return None, f"previous apply ({state.get('status')}) left no checkpoint: training from the start"
    return ckpt, f"resuming the {state.get('status')} run from {ckpt}"


def finished_lines(plan: Plan, restart: bool) -> list[str] | None:
    """What to say instead of training when the output dir holds a completed run this plan asks no
    more of (lifecycle/drift.py finished_run); None when there is something to train."""
    from gpuplan.apply.train.checkpoints import find_resumable
    from gpuplan.lifecycle.drift import finished_run
    from gpuplan.lifecycle.state import load_state
    from gpuplan.render.state import render_finished

    out = plan.resolved.output.dir
    state = None if restart else load_state(out)
    done = None if state is None else finished_run(state, plan)
    return None if done is None else render_finished(done, out, find_resumable(out, on_bucket=plan.resolved.launch.on_bucket)[0])


def apply_plan(
    plan: Plan,
    *,
    target: str,
    node_rank: int | None,
    env: Mapping[str, str],
    restart: bool,
    break_lock: bool,
    confirm: Callable[[], None],
    echo: Callable[[str], None] = print,
    launcher: Launcher | None = None,
) -> int:
    """Run `plan` on its launcher; `confirm` raises to cancel. Returns the exit code."""
    from gpuplan.lifecycle.run_lock import RunLock

    launcher = launcher or launcher_for(plan, target, node_rank, env)
    if not launcher.holds_run:
        if not launcher.describes:  # printing the commands: nothing trains, nothing to confirm
            return launcher.run(plan, resume_from=None, echo=echo)
        if (done := finished_lines(plan, restart)) is not None:  # node 0 says the same and stops too
            echo("\n".join(done))
            return 0
        resume_from, what = resume_point(plan, restart)  # read-only here: node 0 decides and moves
        echo(f"{launcher.describes}{what}")
        confirm()
        return launcher.run(plan, resume_from=None if restart else resume_from, echo=echo)
    out = plan.resolved.output.dir
    with RunLock(out, break_stale=break_lock):
        if (done := finished_lines(plan, restart)) is not None:  # an apply with no changes changes nothing
            echo("\n".join(done))
            return 0
        resume_from, what = resume_point(plan, restart)
        echo(what)
        confirm()
        if restart and (moved := supersede_checkpoints(out)):
            echo(f"Moved the old checkpoints to {moved}")
        elif not restart:
            for line in set_aside_lines(out, on_bucket=plan.resolved.launch.on_bucket):
                echo(line)
        return launcher.run(plan, resume_from=resume_from, echo=echo)
