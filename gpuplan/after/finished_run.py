"""A spec's finished run: its state, the plan it trained, the directory a command loads.

No torch: the commands find and check the run before anything heavy loads, so every
refusal is quick and writes nothing. The plan is the one in gpuplan-state.json (what
was trained, with the Hub commits it used), not a fresh plan of the spec: a spec
edited since cannot change which model is loaded. Only its [eval] keys are read from the
spec as it is now (with_eval_settings).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.lifecycle.run_dir import FINAL_DIR, MERGED_DIR, checkpoint_name, checkpoint_step
from gpuplan.plan.methods import Method
from gpuplan.plan.types import Plan


@dataclass(frozen=True)
class FinishedRun:
    spec_path: str
    output_dir: str
    state: dict[str, Any]
    plan: Plan  # the plan the run trained (gpuplan-state.json)
    weights_dir: str  # final/ or checkpoint-N/: the model, or the adapter
    checkpoint: int | None

    @property
    def trained(self) -> Method:
        """What the run trained, as its descriptor (plan/methods.py)."""
        return self.plan.resolved.model.method

    @property
    def merged_dir(self) -> str | None:
        """final/merged/ of a lora run with output.merge_adapter (never for a checkpoint)."""
        d = os.path.join(self.output_dir, FINAL_DIR, MERGED_DIR)
        return d if self.checkpoint is None and os.path.isfile(os.path.join(d, "config.json")) else None


def _error(summary: str, fix: str | None = None, key: str | None = None) -> GpuplanError:
    return GpuplanError([Diagnostic("error", key, summary, fix=fix)])


def spec_settings(spec_path: str) -> dict[str, Any]:
    """The spec's settings as written (paths resolved relative to the spec file), without planning."""
    from gpuplan.plan.inputs.spec_settings import flatten
    from gpuplan.spec.load import load_toml
    from gpuplan.spec.validate import validate_spec

    loaded = load_toml(spec_path)
    spec = validate_spec(loaded.raw)
    return flatten(spec, loaded.path.parent, loaded.path.stem)


def run_of(target: str, command: str) -> tuple[str, str, dict[str, Any] | None]:
    """(spec path, output dir, the spec's settings or None) for a spec file or a run's output dir.

    A run's dir reads the spec its gpuplan-state.json records (plan.spec_path) while that spec still
    writes to this dir; otherwise (the spec moved, or now names another output.dir) the run's own plan
    alone, [eval] keys as they were when it trained."""
    from gpuplan.lifecycle.run_dir import STATE_FILE
    from gpuplan.lifecycle.state import load_state
    from gpuplan.plan.inputs.spec_settings import output_dir

    if not os.path.isdir(target):
        settings = spec_settings(target)
        return target, output_dir(settings), settings
    state = load_state(target)
    if state is None:
        raise _error(
            f"{target}: a folder with no {STATE_FILE}, so not a run's output dir: {command} needs a spec file or a finished run",
            fix=f"give the spec (.toml) of the run, or its output.dir: {command} SPEC.toml",
        )
    recorded = state.get("plan", {}).get("spec_path")
    if recorded and os.path.isfile(recorded):
        try:
            current: dict[str, Any] | None = spec_settings(recorded)
        except GpuplanError:  # the spec was edited into one that no longer loads: the run's own plan
            current = None
        if current is not None and os.path.realpath(output_dir(current)) == os.path.realpath(target):
            return recorded, target, current
    return recorded or target, target, None


def finished_run(target: str, checkpoint: int | None = None, *, command: str) -> FinishedRun:
    """The completed run of `target` (a spec, or a run's output dir) or its checkpoint-N; GpuplanError
    naming what is missing."""
    from gpuplan.lifecycle.state import load_state

    spec_path, out, settings = run_of(target, command)
    state = load_state(out)
    apply_cmd = f"gpuplan apply {spec_path} --yes"
    if state is None:
        raise _error(
            f"{out}: no run here yet (no gpuplan-state.json): {command} needs a finished run",
            fix=f"train first: {apply_cmd}",
            key="output.dir",
        )
    status = state.get("status")
    if checkpoint is None and status != "completed":
        why = f" ({state['error']})" if state.get("error") else ""
        raise _error(
            f"{out}: the last apply is {status}{why}, so there is no final model",
            fix=f"finish it: {apply_cmd}, or use a checkpoint with --checkpoint N "
            f"(saved: {', '.join(map(str, checkpoints(out))) or 'none'})",
            key="output.dir",
        )
    plan = Plan.from_dict(state["plan"])
    if settings is not None:
        plan = with_eval_settings(plan, settings)
    if checkpoint is not None:
        weights = os.path.join(out, checkpoint_name(checkpoint))
        if not os.path.isdir(weights):
            saved = checkpoints(out)
            raise _error(
                f"--checkpoint {checkpoint}: {weights} does not exist",
                fix="use one of the saved steps: " + (", ".join(map(str, saved)) if saved else "none are saved; leave out --checkpoint"),
            )
        from gpuplan.apply.train.checkpoints import checkpoint_problem

        if problem := checkpoint_problem(weights):
            raise _error(f"--checkpoint {checkpoint}: {weights} is {problem}", fix="use another checkpoint")
    else:
        weights = os.path.join(out, FINAL_DIR)
        if not os.path.isdir(weights):
            raise _error(f"{weights} is missing although the run completed", fix=f"train again: {apply_cmd} --restart")
    run = FinishedRun(spec_path, out, state, plan, weights, checkpoint)
    check_base(run)
    return run


def with_eval_settings(plan: Plan, settings: dict[str, Any]) -> Plan:
    """The trained plan with the spec's [eval] keys as they are now: they score a run, not train it,
    so a task added after the run counts. ([eval] sample_prompts of the run are in metrics.jsonl.)"""
    return plan.with_settings({k: v for k, v in settings.items() if k.startswith("eval.")})


def checkpoints(output_dir: str) -> list[int]:
    steps = []
    for name in os.listdir(output_dir) if os.path.isdir(output_dir) else []:
        step = checkpoint_step(name)
        if step is not None:
            steps.append(step)
    return sorted(steps)


def check_base(run: FinishedRun) -> None:
    """An adapter needs the base it was trained on, byte for byte."""
    if not run.trained.frozen_base or run.merged_dir is not None:
        return
    from gpuplan.apply.model.base_files import changed_files
    from gpuplan.hub.fetch import model_dir
    from gpuplan.hub.resolve import HubError

    try:
        base = model_dir(run.plan.resolved.model.hub)
    except HubError as e:
        raise GpuplanError(
            [Diagnostic("error", e.key, e.message, fix=e.fix or "fetch it again: gpuplan apply downloads the commit the run used")]
        ) from None
    recorded = (run.state.get("results") or {}).get("base_files")
    if base is None or not os.path.isdir(base):
        raise _error(
            f"the base model {base} this adapter was trained on is gone",
            key="model.name_or_path",
            fix="restore it (the adapter only works on that base)",
        )
    if recorded is None:
        return  # a run from before bases were recorded: nothing to compare with
    changes = changed_files(recorded, base)
    if changes:
        shown = "; ".join(changes[:5]) + (f"; and {len(changes) - 5} more" if len(changes) > 5 else "")
        raise _error(
            f"the base model in {base} changed since the run trained its adapter on it: {shown}",
            key="model.name_or_path",
            fix=f"restore the base the adapter was trained on, or train again on this one (gpuplan apply {run.spec_path} --yes --restart)",
        )
