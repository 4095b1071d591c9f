"""The value types the spec's sections share: "auto", bounded numbers, paths, the objective check,
and the section base (unknown keys refused, strict types, frozen)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

Auto = Literal["auto"]
Task = Literal["causal-lm", "seq-cls", "masked-lm"]
# Bounds keep hostile numbers out of the arithmetic; constraints sit inside the union
# so that "auto" is not compared with a number.
BatchOrAuto = Annotated[int, Field(ge=1, le=2**20)] | Auto
WorkersOrAuto = Annotated[int, Field(ge=0, le=256)] | Auto
StepsOrAuto = Annotated[int, Field(ge=0, le=2**31)] | Auto


def _no_nul(path: str) -> str:
    if "\x00" in path:  # the OS refuses it (ValueError: embedded null byte), so refuse it here
        raise ValueError("a path cannot contain a NUL character (\\u0000); remove it")
    return path


PathStr = Annotated[str, AfterValidator(_no_nul)]


def closed_set(values: Callable[[], Iterable[str]]) -> Callable[[dict[str, Any]], None]:
    """A Field's json_schema_extra for a str key whose values a validator or a rule checks (with
    did-you-mean errors a Literal would lose): `gpuplan schema` gives them as an enum, so editors
    offer them. `values` is called when the schema is made, not when the spec is imported."""

    def extra(schema: dict[str, Any]) -> None:
        schema["enum"] = list(dict.fromkeys(values()))

    return extra


def objective_names() -> tuple[str, ...]:
    """training.objective: what _known_objective accepts (spec/objectives.py OBJECTIVES)."""
    from gpuplan.spec.objectives import OBJECTIVES

    return tuple(OBJECTIVES)


def optimizer_names() -> tuple[str, ...]:
    """training.optim: what spec/validate.py _check_optim accepts; the removed names are planned as
    their replacement, with the reason (plan/rules/optimizer.py)."""
    from gpuplan.spec.names import OPTIMIZER_NAMES, REMOVED_OPTIMIZERS

    return ("auto", *OPTIMIZER_NAMES, *REMOVED_OPTIMIZERS)


def preference_loss_names() -> tuple[str, ...]:
    """preference.loss_type: "auto" and every loss of a preference objective that plans
    (plan/rules/preference.py checks the one training.objective names; an sft run does not read the
    key). The losses that need a label_smoothing no key sets are refused by the plan, with the reason,
    so the schema does not offer them."""
    from gpuplan.spec.objectives import NEEDS_LABEL_SMOOTHING, OBJECTIVES

    return ("auto", *(loss for o in OBJECTIVES.values() for loss in o.loss_types if loss not in NEEDS_LABEL_SMOOTHING))


LAUNCH_TARGETS = ("local", "slurm", "kubernetes", "skypilot", "ray")


def launch_target_names() -> tuple[str, ...]:
    """launch.target: where `gpuplan apply` runs the plan (gpuplan/clusters/ hands it off)."""
    return LAUNCH_TARGETS


def _known_target(name: str) -> str:
    if name in LAUNCH_TARGETS:
        return name
    import difflib

    close = difflib.get_close_matches(name.lower(), list(LAUNCH_TARGETS), n=1, cutoff=0.5)
    hint = f'did you mean "{close[0]}"? ' if close else ""
    raise ValueError(f'"{name}" is not a launch target; {hint}set launch.target = ' + " or ".join(f'"{t}"' for t in LAUNCH_TARGETS))


def _known_objective(name: str) -> str:
    from gpuplan.spec.objectives import EXPERIMENTAL_IN_TRL, OBJECTIVES

    if name in OBJECTIVES:
        return name
    if name in EXPERIMENTAL_IN_TRL:
        raise ValueError(f'"{name}" is not planned: {EXPERIMENTAL_IN_TRL[name]}; set training.objective = "dpo"')
    import difflib

    close = difflib.get_close_matches(name, list(OBJECTIVES), n=1, cutoff=0.5)
    hint = f'did you mean "{close[0]}"? ' if close else ""
    raise ValueError(
        f'"{name}" is not an objective; {hint}set training.objective = {" or ".join(chr(34) + o + chr(34) for o in OBJECTIVES)}'
    )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)
