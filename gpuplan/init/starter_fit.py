"""`gpuplan init`: a starter spec that plans cleanly, its method and memory savers chosen by the planner.

The starter is planned as written with model.method = "auto" (or the --method given). The
planner (plan/rules/memory.py, rules/lora.py) tries full, then lora, then qlora, and turns
on the memory savers the spec leaves "auto"; no second copy of that logic lives here. The
method it chose, and each saver it turned on, are written into the spec as values with the
planner's reason as the comment above them, and the result is planned again: init writes
only a spec whose plan succeeds, and returns that plan for its one-line summary.
`plan` (spec text -> Plan, raising PlanError) comes from the CLI edge; the spec key behind
each saver comes from the planner's saver table (plan/fit/savers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.init.model_source import ModelSource, chat_template_known
from gpuplan.init.starter import starter_spec
from gpuplan.plan.fit.fixes import NoFitError
from gpuplan.spec.data_format import DataFormat
from gpuplan.spec.objectives import OBJECTIVES

METHODS = ("full", "lora", "qlora", "auto")
EPOCHS = 3.0  # TrainingArguments.num_train_epochs' default
SOURCE_KEYS = ("data.train_files", "data.dataset")


@dataclass(frozen=True)
class Starter:
    text: str
    plan: Any  # the Plan of `text`
    method: str
    method_reason: str
    savers: dict[str, tuple[Any, str]]  # spec key -> (value, the planner's reason) for each saver it turned on


def data_choices(source: ModelSource, data: tuple[dict[str, Any], DataFormat] | None, task: str) -> dict[str, tuple[Any, str | None]]:
    """The --data keys, with the format's reason above data.format (and above the chat template)."""
    if data is None:
        return {}
    values, fmt = data
    out: dict[str, tuple[Any, str | None]] = {k: (v, fmt.notes.get(k)) for k, v in values.items()}
    # The data's size is known only when apply reads it: passes over it, not a step count.
    out["training.max_steps"] = (None, None)
    out["training.num_train_epochs"] = (
        EPOCHS,
        f"--data given: {EPOCHS:g} passes over it (the Trainer's default), "
        "as many steps as the data makes; set max_steps instead for a fixed "
        "length and for the plan's run time and cost.",
    )
    first = "data.format" if "data.format" in values else next(k for k in values if k not in SOURCE_KEYS)
    out[first] = (out[first][0], fmt.summary)
    if values.get("data.format") == "chat" and task == "causal-lm":
        known = chat_template_known(source)
        if known is False:
            out["data.chat_template"] = (
                "chatml",
                f"The tokenizer in {source.name} has no chat template: gpuplan's ChatML (<|im_start|>role ... <|im_end|>).",
            )
        elif known is None and source.key == "model.config":
            out["data.chat_template"] = ("chatml", "A config.json has no tokenizer: gpuplan's ChatML template.")
        elif known is None:
            out["data.chat_template"] = (
                "chatml",
                f"The tokenizer of {source.name} is not in the cache (planning "
                "reads only config.json): gpuplan's ChatML, so apply works whichever "
                "it is; "
                "comment this line out to use the tokenizer's own template.",
            )
    return out


def fitted_starter(
    source: ModelSource,
    gpu: str,
    *,
    task: str,
    spec_path: Path,
    method: str,
    data: tuple[dict[str, Any], DataFormat] | None,
    plan: Callable[[str], Any],
    objective: str | None = None,
) -> Starter:
    """The starter with the planner's method and savers; raises GpuplanError (the plan's own
    errors, nothing written) when no method fits on `gpu`."""
    if method not in METHODS:
        raise GpuplanError(
            [Diagnostic("error", "model.method", f"--method {method!r}: not a method", fix=f"use one of {', '.join(METHODS)}")]
        )
    base = data_choices(source, data, task)
    if objective is not None:  # --objective: the user's, over what the rows suggested
        note = f"Set by init --objective {objective}."
        if objective == "kto" and data is not None and data[1].objective == "dpo":
            note = (
                "Set by init --objective kto. The rows are prompt / chosen / rejected pairs: KTO trains on them "
                "unpaired, each pair's chosen completion with label true and its rejected one with label false, "
                "as TRL's KTOTrainer unpairs them (trl/data_utils.py unpair_preference_dataset)."
            )
        base["training.objective"] = (objective, note)
    chosen_objective = OBJECTIVES.get(base.get("training.objective", (None, None))[0] or "sft")
    if chosen_objective is not None and chosen_objective.default_learning_rate is not None:
        rate = chosen_objective.default_learning_rate
        base["training.learning_rate"] = (
            rate,
            f"TRL's default for {chosen_objective.name} ({chosen_objective.config_class}), not SFT's 5e-5.",
        )
    spec_dir = spec_path.parent
    asked = starter_spec(source, gpu, task=task, spec_dir=spec_dir, choices={**base, "model.method": (method, None)})
    first, sized = _sized_to_data(plan, asked)
    if sized:  # the starter's batch is more than the data holds: the plan's own value for it
        base.update(sized)
        asked = starter_spec(source, gpu, task=task, spec_dir=spec_dir, choices={**base, "model.method": (method, None)})
    if first is None:
        first = _plan(plan, asked, method)
    where = first.hardware.name
    chosen = first.settings["model.method"]
    if method == "auto":
        reason = chosen.reason or ""  # the method rule's reason (plan/rules/lora.py select_method)
        note = f"Chosen by the plan on {where} (init --method auto): {reason}."
    else:
        reason = f"--method {method}"
        note = f"Set by init --method {method}; it fits on {where}."
    choices: dict[str, tuple[Any, str | None]] = {**base, "model.method": (chosen.value, note)}
    savers: dict[str, tuple[Any, str]] = {}
    from gpuplan.plan.fit.savers import BY_NAME  # the saver table: the spec key behind each saver

    for saver in first.memory.savers:
        key = BY_NAME[saver.name].setting if saver.name in BY_NAME else None
        if key is None or key in choices or first.settings[key].source == "user":
            continue
        setting = first.settings[key]
        savers[key] = (setting.value, setting.reason or "")
        choices[key] = (setting.value, f"Turned on by the plan on {where}: {setting.reason}.")
    text = starter_spec(source, gpu, task=task, spec_dir=spec_dir, choices=choices)
    final = _plan(plan, text, method)
    return Starter(text, final, chosen.value, reason, savers)


# Starter values init may replace with the value a plan error asks for (Diagnostic.fix_values).
SIZED = ("training.effective_batch_size",)


def _sized_to_data(plan: Callable[[str], Any], text: str) -> tuple[Any, dict[str, tuple[Any, str]]]:
    """(the starter's plan, {}), or (None, the starter values the plan asks to change for this
    data, with its value and its reason): an effective batch larger than the training
    sequences is an error when they were counted, a warning when estimated
    (spec/data_steps.py); init takes the plan's value either way."""
    try:
        first = plan(text)
        diagnostics = first.diagnostics
    except GpuplanError as e:
        first, diagnostics = None, e.diagnostics
    sized = {
        k: (v, f"Sized to the data: {d.summary}; {d.detail}." if d.detail else f"Sized to the data: {d.summary}.")
        for d in diagnostics
        if d.severity != "note" and d.fix_values
        for k, v in d.fix_values.items()
        if k in SIZED
    }
    return (None if sized else first), sized


def _plan(plan: Callable[[str], Any], text: str, method: str) -> Any:
    """The plan of the starter; when it fails, its errors and warnings and what init can change."""
    try:
        return plan(text)
    except GpuplanError as e:
        kept = [d for d in e.diagnostics if d.severity != "note"]  # the notes are about a spec not written
        # the GPUs the refusal's fix names, from its record (plan/fit/fixes.py NoFitError), not its words
        options = e.options if isinstance(e, NoFitError) else ()
        gpus = sorted({str(o["hardware.gpu"]) for o in options if o.get("hardware.gpu") is not None})
        # the plan's fixes name spec lines of a spec not written: said as init's options
        other_gpu = ("run init again with " + " or ".join(f"--gpu {g}" for g in gpus)) if gpus else None
        fix: str | None
        if method != "auto":
            fix = "--method auto lets the planner choose full, lora or qlora, whichever fits" + (f"; or {other_gpu}" if other_gpu else "")
        else:
            fix = other_gpu
        raise GpuplanError(
            [
                *kept,
                Diagnostic(
                    "note",
                    None,
                    f"gpuplan init writes only a spec that plans"
                    f"{'' if method != 'auto' else ' (full, lora and qlora tried)'}: "
                    "nothing was written",
                    fix=fix,
                ),
            ]
        ) from None


def next_steps(out: str, source: ModelSource, starter: Starter, data: bool) -> list[str]:
    """What init prints after the spec is written: what it chose, the plan's summary, what to run."""
    from gpuplan.render.text import summary_line

    lines = [
        f"Wrote {out} for {source.name} on {starter.plan.hardware.name}:",
        f'  model.method = "{starter.method}": {starter.method_reason}',
    ]
    lines += [f"  {k} = {_shown(v)}: {why}" for k, (v, why) in starter.savers.items()]
    lines.append(summary_line(starter.plan.to_dict()))
    if source.key == "model.config":
        scratch = "; or set model.from_scratch = true to train from random weights" if starter.method == "full" else ""
        lines.append(
            f"model.config is a config.json alone, and apply needs weights: run init with a model directory "
            f"or a Hub id (model.name_or_path) before `gpuplan apply {out}`{scratch}"
        )
    if data and source.key == "model.config":  # apply needs weights first: the line above says how
        lines.append(f"Next: gpuplan plan {out}")
    elif data:
        lines.append(f"Next: gpuplan plan {out}, then: gpuplan apply {out}")
    else:
        lines.append(f"Next: set data.train_files (or run init again with --data FILE), then: gpuplan plan {out}")
    return lines


def _shown(value: Any) -> str:
    from gpuplan.toml_value import toml_value

    return toml_value(value)
