"""Chat and instruction data: the task it needs, its chat template, and how it is packed.

Packing whole examples with position ids restarting per example keeps them from
attending to each other only where the model builds its causal mask through
transformers.masking_utils (find_packed_sequence_indices, used when no attention_mask
is passed; flash_attention_2 reads the same position ids, in one row: apply flattens
each micro-batch, gpuplan/apply/data/flatten.py). PACKED_POSITION_FAMILIES lists
the model types checked against transformers 5.24 (tests/apply/test_chat_data.py reads their
modeling files); other families get one padded example per sequence instead.
"""

from __future__ import annotations

import json
import os

from gpuplan.plan.engine.resolver import Resolver
from gpuplan.spec.chat_templates import CHAT_TEMPLATES

PACKED_POSITION_FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi",
        "phi3",
        "gpt2",
        "gpt_neox",
        "olmo",
        "olmo2",
        "granite",
        "starcoder2",
        "cohere",
    }
)


def packing_holds(objective: str, task: str, fmt: str, family: str) -> bool:
    """Whether `data.packing = true` stays on when the plan resolves it (data.checks and
    supervised_packing below): only SFT packs (TRL 1.16 pads each preference batch:
    trl/trainer/dpo_trainer.py, DPOConfig.padding_free "falls back to standard padding"; KTO pads too),
    never seq-cls, and chat / instruction rows only for a family that keeps packed examples apart."""
    if objective != "sft" or task == "seq-cls":
        return False
    return fmt == "text" or family in PACKED_POSITION_FAMILIES


def supervised_packing(ctx: Resolver, fmt: str, seq: int) -> None:
    """data.packing for chat / instruction rows (called by data.checks, which owns the key)."""
    packing = ctx.spec("data.packing")
    family = ctx.facts.model_type
    can = family in PACKED_POSITION_FAMILIES
    if packing is False:
        ctx.keep("data.packing")
    elif can and ctx.get("model.attn_implementation") == "flash_attention_2":
        # transformers 5.24 takes flash-attn's varlen path only for a one-row batch
        # (modeling_flash_attention_utils._is_packed_sequence): gpuplan/apply/data/flatten.py
        ctx.resolve(
            "data.packing",
            True,
            f"{fmt}: whole examples packed into {seq}-token blocks, position ids reset per example; "
            "each micro-batch's blocks are laid end to end in one row, so flash_attention_2's varlen "
            f"kernel (sequence bounds from the position ids) keeps {family}'s examples apart",
        )
    elif can:
        ctx.resolve(
            "data.packing",
            True,
            f"{fmt}: whole examples packed into {seq}-token blocks, position ids reset per example "
            f"so {family} attends within each example only",
        )
    else:
        ctx.resolve(
            "data.packing",
            False,
            f"{fmt}: {family} is not a family known to keep packed examples apart by their position ids; "
            f"each example is padded to {seq} tokens instead",
        )


def chat_checks(ctx: Resolver, fmt: str, task: str) -> None:
    if task != "causal-lm":
        ctx.error(
            "data.format",
            f'data.format = "{fmt}" trains a causal LM on responses, not model.task = "{task}"',
            fix='set model.task = "causal-lm" or data.format = "text"',
        )
    if fmt != "chat" or ctx.spec("data.chat_template") is not None:
        template = ctx.spec("data.chat_template")
        if fmt == "chat" and template not in CHAT_TEMPLATES and not os.path.isfile(template):
            ctx.error(
                "data.chat_template",
                f"data.chat_template = {template!r}: no such file",
                fix=f'set data.chat_template = "chatml" or a path to a Jinja file ({", ".join(CHAT_TEMPLATES)})',
            )
        return
    source = ctx.spec("model.name_or_path") if not ctx.spec("model.from_scratch") else None
    if source is None or os.path.isdir(source) and not has_chat_template(source):
        where = (
            "a model trained from scratch uses the byte-level tokenizer, which has none"
            if source is None
            else f"the tokenizer in {source} has none"
        )
        ctx.error("data.chat_template", f'data.format = "chat" needs a chat template: {where}', fix='set data.chat_template = "chatml"')


def has_chat_template(model_dir: str) -> bool:
    """Whether the tokenizer files in a local model dir carry a chat template (transformers' three places)."""
    if any(os.path.isfile(os.path.join(model_dir, n)) for n in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            return bool(json.load(f).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False
