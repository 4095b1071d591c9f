"""Data and schedule checks that only the spec and the model can answer.

- seq_len beyond the model's positions: an error for learned absolute position
  embeddings (index out of range at run time), a warning for rotary models.
- packing: on for language modelling, off for classification (one example, one label).
- seq-cls needs a label field; num_labels defaults to 2.
- warmup_steps with warmup_ratio: error (TrainingArguments accepted only one); a
  ratio becomes steps when max_steps is known, else a fraction (<1) the Trainer reads as a ratio.
"""

from __future__ import annotations

import math

from gpuplan.plan.context import Resolver
from gpuplan.plan.graph import Rule

# Families whose positions are a learned table of max_position_embeddings rows.
LEARNED_POSITIONS = {"gpt2", "bert", "roberta", "opt", "distilbert", "xlm-roberta", "electra", "gpt_bigcode", "biogpt"}
# RoBERTa-style embeddings start positions after padding_idx (modeling_roberta.py
# create_position_ids_from_input_ids): 2 of the table's rows are never usable.
POSITION_OFFSET = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


def data_checks(ctx: Resolver) -> None:
    facts = ctx.facts
    task = ctx.spec("model.task")
    seq = ctx.spec("data.seq_len")
    maxpos = facts.max_position_embeddings
    if maxpos is not None:
        maxpos -= POSITION_OFFSET.get(facts.model_type, 0)
    if maxpos is not None and seq > maxpos:
        if facts.model_type in LEARNED_POSITIONS:
            ctx.error("data.seq_len", f"data.seq_len = {seq} exceeds the {maxpos} learned positions of {facts.model_type}",
                      fix=f"set data.seq_len = {maxpos} or less")
        else:
            ctx.warn("data.seq_len", f"data.seq_len = {seq} is beyond the model's max_position_embeddings = {maxpos}",
                     detail="rotary models run, but quality past the trained length needs rope scaling",
                     fix=f"set data.seq_len = {maxpos} or configure rope_scaling")
    packing = ctx.spec("data.packing")
    if packing == "auto":
        on = task != "seq-cls"
        ctx.resolve("data.packing", on,
                    f"{task}: documents packed into {seq}-token blocks, no padding" if on
                    else "seq-cls: one example, one label: truncated and padded, not packed")
    elif packing and task == "seq-cls":
        ctx.resolve("data.packing", False, "seq-cls: packing would merge examples with different labels")
    else:
        ctx.keep("data.packing")
    labels = ctx.spec("model.num_labels")
    if task == "seq-cls":
        if ctx.spec("data.label_field") is None and ctx.spec("data.train_files"):
            ctx.error("data.label_field", "model.task = \"seq-cls\" needs data.label_field", fix='set data.label_field = "label"')
        if labels is None:
            ctx.resolve("model.num_labels", 2, "seq-cls without num_labels: two classes, as transformers assumes")
        else:
            ctx.keep("model.num_labels")
    else:
        ctx.keep("model.num_labels")
    if not ctx.spec("data.train_files"):
        ctx.note("data.train_files", "no data.train_files: the plan is complete, apply needs data",
                 fix='set data.train_files = ["data/train.jsonl"]')


def warmup(ctx: Resolver) -> None:
    ratio = ctx.spec("training.warmup_ratio")
    if ratio is None:
        ctx.keep("training.warmup_steps")
        return
    if ctx.is_user("training.warmup_steps"):
        ctx.error("training.warmup_ratio", "training.warmup_steps and training.warmup_ratio are both set",
                  fix="keep one of them")
        ctx.keep("training.warmup_steps")
        return
    max_steps = ctx.spec("training.max_steps")
    if max_steps:
        steps = math.ceil(ratio * max_steps)
        ctx.resolve("training.warmup_steps", steps, f"warmup_ratio {ratio} x max_steps {max_steps}, rounded up")
    else:
        ctx.resolve("training.warmup_steps", ratio,
                    f"warmup_ratio {ratio} without max_steps: the Trainer reads a value below 1 as a ratio")


# Schedulers that step on the eval loss: TrainingArguments raises without an eval
# strategy ("lr_scheduler_type reduce_lr_on_plateau requires an eval strategy", 5.24).
EVAL_SCHEDULERS = ("reduce_lr_on_plateau", "greedy")


def scheduler_needs_eval(ctx: Resolver) -> None:
    name = ctx.spec("training.lr_scheduler_type")
    if name in EVAL_SCHEDULERS and not ctx.spec("data.eval_files") and not ctx.spec("data.eval_fraction"):
        ctx.error("training.lr_scheduler_type",
                  f'training.lr_scheduler_type = "{name}" steps on the eval loss, but the spec has no eval data '
                  "(TrainingArguments refuses it without an eval strategy)",
                  fix='set data.eval_fraction = 0.05 (or data.eval_files), or training.lr_scheduler_type = "cosine"')


RULES = (
    Rule("schedule.eval_scheduler", reads=("spec:training.lr_scheduler_type", "spec:data.eval_files", "spec:data.eval_fraction"),
         writes=(), apply=scheduler_needs_eval,
         doc="reduce_lr_on_plateau and greedy need eval data."),
    Rule("data.checks", reads=("spec:data.seq_len", "spec:model.task", "spec:data.packing", "spec:model.num_labels",
                               "spec:data.label_field", "spec:data.train_files"),
         writes=("data.packing", "model.num_labels"), apply=data_checks,
         doc="seq_len vs positions, packing by task, seq-cls labels."),
    Rule("schedule.warmup", reads=("spec:training.warmup_ratio", "spec:training.warmup_steps", "spec:training.max_steps"),
         writes=("training.warmup_steps",), apply=warmup,
         doc="warmup_steps xor warmup_ratio; a ratio becomes steps."),
)
