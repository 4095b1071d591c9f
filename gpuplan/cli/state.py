"""The lifecycle at the CLI edge: saved-plan staleness, drift since the last apply, `gpuplan show`.

Reads files (the spec, gpuplan-state.json) and probes the device; the decisions
themselves are pure functions in gpuplan.plan.fingerprint and gpuplan.lifecycle.drift.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.lifecycle.drift import diff_plans
from gpuplan.lifecycle.run_dir import STATE_FILE
from gpuplan.lifecycle.state import load_state
from gpuplan.plan.fingerprint import stale_reasons
from gpuplan.plan.types import Plan


def check_saved_plan(plan: Plan, detect, *, here: bool = True) -> None:
    """Refuse a saved plan that no longer matches the spec, the hardware or the packages.

    here=False: the plan is handed off to a cluster ([launch]), so only the spec and the settings are
    checked on this machine; the job's own apply checks the hardware and the packages on the nodes."""
    from gpuplan.plan.inputs.environment import local_environment

    spec_hash = None
    if plan.spec_path:
        try:
            spec_hash = hashlib.sha256(Path(plan.spec_path).read_bytes()).hexdigest()
        except OSError:
            spec_hash = None
    hardware_now = None
    if here and not plan.hardware.is_cpu:
        hardware_now = detect().to_dict()
    environment_now = local_environment() if here else None
    reasons = stale_reasons(plan, spec_sha256_now=spec_hash, hardware_now=hardware_now, environment_now=environment_now)
    if reasons:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    None,
                    "stale plan: " + "; ".join(reasons),
                    fix=f"plan again: gpuplan plan {plan.spec_path or 'SPEC'} --out PLAN.json",
                )
            ]
        )


def drift_since_apply(plan: Plan) -> dict[str, Any] | None:
    """{status, finished_at, changes: [{key, before, after}]} against the last apply, or None."""
    state = load_state(plan.resolved.output.dir)
    if state is None:
        return None
    changes = [{"key": d.key, "before": d.before, "after": d.after} for d in diff_plans(Plan.from_dict(state["plan"]), plan)]
    return {
        "status": state.get("status"),
        "finished_at": state.get("finished_at"),
        "started_at": state.get("started_at"),
        "changes": changes,
    }


def show(target: str) -> tuple[dict[str, Any], str, str | None]:
    """A run's state (the target an output dir, or a spec whose output.dir it is) or a saved plan:
    (JSON-ready dict, text, the run's dir or None)."""
    from gpuplan.render.run_metrics import read_metrics
    from gpuplan.render.state import render_run_state
    from gpuplan.render.text import render_plan

    path = Path(target)
    what = str(path)
    if path.suffix == ".toml" and path.is_file():
        from gpuplan.after.finished_run import spec_settings
        from gpuplan.plan.inputs.spec_settings import output_dir

        what = f"{path} (its output.dir)"
        path = Path(output_dir(spec_settings(target)))
        if load_state(path) is None:
            raise GpuplanError(
                [
                    Diagnostic(
                        "error",
                        "output.dir",
                        f"{path}: no {STATE_FILE}: nothing was applied from {target} yet",
                        fix=f"see its plan: gpuplan plan {target}; run it: gpuplan apply {target}",
                    )
                ]
            )
    if path.is_dir():
        state = load_state(path)
        if state is None:
            raise GpuplanError(
                [
                    Diagnostic(
                        "error",
                        None,
                        f"{what}: no {STATE_FILE}: nothing was applied here",
                        fix="give a run's output dir, its spec (.toml) or a saved plan (.json)",
                    )
                ]
            )
        metrics = read_metrics(path)
        if "job" in state:  # handed off to a cluster: what its engine says now
            from gpuplan.clusters.handoff import remote_status

            state = {**state, "remote_job": remote_status(state)}
        return state, render_run_state(str(path), state, metrics.loss, metrics.rewards, metrics.samples), str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        Plan.from_dict(data)
    except FileNotFoundError:
        raise GpuplanError([Diagnostic("error", None, f"{path}: no such file or directory")]) from None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    None,
                    f"{path}: not a gpuplan plan ({type(e).__name__}: {e})",
                    fix="give a run's output dir, its spec (.toml) or a saved plan (.json from gpuplan plan SPEC --out PLAN.json)",
                )
            ]
        ) from None
    return data, render_plan(data), None


def cmd_show(args) -> int:
    from gpuplan.render.json import dumps

    data, text, run_dir = show(args.target)
    if getattr(args, "plot", None):
        from gpuplan.cli.plot import write_plot

        print(write_plot(run_dir or args.target, data, args.plot), file=sys.stderr)
    sys.stdout.write(dumps(data) if args.json else text)
    return 0
