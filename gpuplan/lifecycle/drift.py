"""Differences between two plans: what changed since the last apply, what a resume cannot take,
and whether a completed run has anything left to train.

Pure functions over Plans (the "plan" of gpuplan-state.json is read back with Plan.from_dict).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuplan.plan.types import Plan

# Changing these mid-run changes what is being trained: resuming would silently mix
# two runs (the Trainer itself only warns for batch size and logging/eval/save steps;
# transformers #18070, #21271). How the effective batch is split may change.
RESUME_BREAKING = {
    "model.config": "the model",
    "model.name_or_path": "the model",
    "model.from_scratch": "the model's initialisation",
    "model.commit": "the model (its Hub commit)",
    "data.commit": "the training data (its Hub commit)",
    "model.task": "the task (and the model head)",
    "model.num_labels": "the classification head",
    "model.dtype": "the weight dtype",
    "data.train_files": "the training data",
    "data.text_field": "the training data",
    "data.label_field": "the labels",
    "data.seq_len": "the sequence length",
    "data.packing": "how data is packed",
    "data.eval_fraction": "the train/eval split",
    "data.dataset": "the training data",
    "data.format": "how rows become training text",
    "data.messages_field": "the training data",
    "data.chat_template": "how rows become training text",
    "data.prompt_field": "the training data",
    "data.response_field": "the training data",
    "data.prompt_template": "how rows become training text",
    "data.train_on_prompt": "which tokens are trained",
    "training.effective_batch_size": "the effective batch (and so the optimisation)",
    "training.seed": "the data order",
    "training.learning_rate": "the learning-rate schedule",
    "training.lr_scheduler_type": "the learning-rate schedule",
    "training.warmup_steps": "the learning-rate schedule",
    "training.optim": "the optimizer (its saved state would not load)",
    # what is trained: the checkpoint of an adapter run holds only the adapter, shaped by these
    "model.method": "what is trained (every weight, or adapters on a frozen base)",
    "lora.r": "the adapter shapes (the checkpoint would not load)",
    "lora.lora_alpha": "the adapter scaling",
    "lora.lora_dropout": "the adapter training",
    "lora.target_modules": "which layers carry adapters (the checkpoint would not load)",
    "lora.use_dora": "the adapter type",
    "lora.modules_to_save": "which modules train in full",
    "quantization.bnb_4bit_quant_type": "the 4-bit base the adapters were trained on",
    "quantization.bnb_4bit_use_double_quant": "the 4-bit base the adapters were trained on",
    "quantization.bnb_4bit_compute_dtype": "the 4-bit base's compute dtype",
    # the objective (spec/objectives.py): what the loss is and what it is measured against
    "training.objective": "the loss (sft, dpo or kto)",
    "preference.beta": "the preference loss's strength",
    "preference.loss_type": "the preference loss",
    "preference.max_length": "the sequence length of prompt + answer",
    "preference.reference": "the reference the rewards are measured against",
    "preference.reference_model": "the reference model",
}


@dataclass(frozen=True)
class Drift:
    key: str
    before: Any
    after: Any


def _values(plan: Plan) -> dict[str, Any]:
    return {k: s.value for k, s in plan.settings.items()}


def diff_plans(old: Plan, new: Plan) -> list[Drift]:
    """Resolved settings that differ, plus the hardware, in key order."""
    a, b = _values(old), _values(new)
    out = [Drift(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    ha, hb = old.hardware.name, new.hardware.name
    if ha != hb:
        out.insert(0, Drift("hardware.name", ha, hb))
    return out


def resume_conflicts(old: Plan, new: Plan) -> list[str]:
    """Why the new plan cannot continue the old plan's run (empty: it can)."""
    methods = {p.resolved.model.method for p in (old, new)}
    return [
        f"{d.key}: {d.before!r} -> {d.after!r} changes {RESUME_BREAKING[d.key]}"
        for d in diff_plans(old, new)
        if d.key in RESUME_BREAKING and any(m.trains(d.key) for m in methods)
    ]


@dataclass(frozen=True)
class Finished:
    """A completed run the new plan asks no more of: applying it would change nothing."""

    step: int  # the optimizer steps the run completed
    changes: list[Drift]  # settings that differ from the applied plan (none: the same plan)
    asks_for: int  # the steps the new plan trains to


def finished_run(state: Mapping[str, Any], new: Plan) -> Finished | None:
    """The completed run in `state` when `new` would train no step past it, else None.

    Terraform's rule: an apply with no changes changes nothing. A resume from the checkpoint
    at the last step is not a no-op: the Trainer's loop checks for the end only after a step
    (transformers trainer.py _run_epoch; DefaultFlowCallback.on_step_end in trainer_callback.py
    sets should_training_stop once global_step >= max_steps), so it trains one step past max_steps. The new plan's step target is
    training.max_steps, or, without one, the steps the run made of its epochs when
    num_train_epochs is the same (the data and the effective batch are resume-breaking:
    resume_conflicts refuses their changes before this is asked).
    """
    if state.get("status") != "completed":
        return None
    step = (state.get("progress") or {}).get("global_step")
    if not isinstance(step, int):
        return None
    old = Plan.from_dict(dict(state["plan"]))
    changes = diff_plans(old, new)
    if not changes:
        return Finished(step, [], step)
    if resume_conflicts(old, new):
        return None  # a change a resume cannot take: apply refuses it (apply/launch/session.py) or trains anew
    a, b = old.resolved.training, new.resolved.training
    if b.max_steps is not None:
        target = b.max_steps
    elif a.max_steps is None and a.num_train_epochs == b.num_train_epochs:
        target = int((state.get("progress") or {}).get("max_steps") or step)
    else:
        return None  # other epochs: the Trainer counts the steps they make
    return Finished(step, changes, target) if target <= step else None
