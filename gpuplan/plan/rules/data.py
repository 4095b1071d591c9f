"""Data checks that only the spec and the model can answer.

- seq_len beyond the model's positions: an error for learned absolute position
  embeddings (index out of range at run time), a warning for rotary models.
- packing: on for language modelling, off for classification (one example, one label);
  chat / instruction data: chat_data.py.
- seq-cls needs a label field; num_labels defaults to 2.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.rules.chat_data import chat_checks, supervised_packing

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
            ctx.error(
                "data.seq_len",
                f"data.seq_len = {seq} exceeds the {maxpos} learned positions of {facts.model_type}",
                fix=f"set data.seq_len = {maxpos} or less",
            )
        else:
            ctx.warn(
                "data.seq_len",
                f"data.seq_len = {seq} is beyond the model's max_position_embeddings = {maxpos}",
                detail="rotary models run, but quality past the trained length needs rope scaling",
                fix=f"set data.seq_len = {maxpos} or configure rope_scaling",
            )
    packing = ctx.spec("data.packing")
    fmt = ctx.spec("data.format")
    if ctx.spec("training.objective") != "sft":
        # TRL 1.16's DPOConfig.padding_free "falls back to standard padding"; KTO pads its batches too
        ctx.resolve(
            "data.packing",
            False,
            f"{ctx.spec('training.objective')}: TRL pads each batch of prompt + answer sequences; preference examples are not packed",
        )
        if fmt == "chat":  # conversational pairs: rendered by the chat template
            chat_checks(ctx, fmt, task)
    elif fmt != "text":
        chat_checks(ctx, fmt, task)
        supervised_packing(ctx, fmt, seq)
    elif packing == "auto":
        on = task != "seq-cls"
        ctx.resolve(
            "data.packing",
            on,
            f"{task}: documents packed into {seq}-token blocks, no padding"
            if on
            else "seq-cls: one example, one label: truncated and padded, not packed",
        )
    elif packing and task == "seq-cls":
        ctx.resolve("data.packing", False, "seq-cls: packing would merge examples with different labels")
    else:
        ctx.keep("data.packing")
    labels = ctx.spec("model.num_labels")
    if task == "seq-cls":
        if ctx.spec("data.label_field") is None and ctx.spec("data.train_files"):
            ctx.error("data.label_field", 'model.task = "seq-cls" needs data.label_field', fix='set data.label_field = "label"')
        if labels is None:
            ctx.resolve("model.num_labels", 2, "seq-cls without num_labels: two classes, as transformers assumes")
        else:
            ctx.keep("model.num_labels")
    else:
        ctx.keep("model.num_labels")
    split = ctx.spec("data.split")
    if split != "train" and not ctx.spec("data.dataset"):  # the split of a Hub dataset (gpuplan/hub/splits.py)
        ctx.warn(
            "data.split",
            f"data.split = {split!r} is read only with data.dataset; data.train_files are read whole",
            fix="remove data.split, or list only that split's files in data.train_files",
        )
    if not ctx.spec("data.train_files") and not ctx.spec("data.dataset"):
        ctx.note(
            "data.train_files",
            "no data.train_files: the plan is complete, apply needs data",
            fix='set data.train_files = ["data/train.jsonl"]',
        )


RULES = (
    Rule(
        "data.checks",
        reads=(
            "spec:data.seq_len",
            "spec:model.task",
            "spec:data.packing",
            "spec:model.num_labels",
            "spec:data.label_field",
            "spec:data.train_files",
            "spec:data.format",
            "spec:data.chat_template",
            "spec:model.name_or_path",
            "spec:model.from_scratch",
            "spec:data.dataset",
            "spec:data.split",
            "model.attn_implementation",
            "spec:training.objective",
        ),
        writes=("data.packing", "model.num_labels"),
        apply=data_checks,
        doc="seq_len vs positions, packing by task, seq-cls labels.",
    ),
)
