"""Chat and instruction rows -> text segments marked trained or masked, then token ids and labels.

A conversation is rendered with a chat template; each assistant turn is the text the
template adds between rendering the conversation up to that turn with the generation
prompt (the "<|im_start|>assistant\\n" header) and rendering it with the turn included,
the way TRL's assistant-only loss and torchtune's per-message masks delimit it. Only
those spans are trained unless data.train_on_prompt = true.

Reads plan values data.format, data.messages_field, data.chat_template, data.prompt_field,
data.response_field, data.prompt_template, data.train_on_prompt.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.types import Plan
from gpuplan.spec.chat_templates import CHAT_TEMPLATES

IGNORE_INDEX = -100  # the label torch's cross_entropy (and transformers' loss) skips
Segments = list[tuple[str, bool]]  # (text, trained)


@dataclass(frozen=True)
class Formatter:
    """Turns one row into segments; built once per run from the plan."""

    fmt: str  # "text" | "chat" | "instruction"
    segments: Callable[[dict[str, Any], int], Segments]  # (row, row index) -> segments
    fields: tuple[tuple[str, str], ...]  # (spec key, column) the rows must have


def chat_template_of(plan: Plan, tokenizer: Any) -> str:
    """data.chat_template (a name or a Jinja file) when set, else the tokenizer's own."""
    want = plan.resolved.data.chat_template
    if want is None:
        own = getattr(tokenizer, "chat_template", None)
        if not own:
            raise ApplyError(
                'data.format = "chat" but the tokenizer has no chat template and data.chat_template is not set; '
                'set data.chat_template = "chatml" (or a path to a Jinja file)'
            )
        return own if isinstance(own, str) else own.get("default", next(iter(own.values())))
    if want in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[want]
    if not os.path.isfile(want):
        raise ApplyError(f'data.chat_template = {want!r}: no such file; use "chatml" or a path to a Jinja file')
    with open(want, encoding="utf-8") as f:
        return f.read()


def _messages(row: dict[str, Any], field: str, index: int) -> list[dict[str, str]]:
    msgs = row.get(field)
    where = f"data.messages_field = {field!r}: row {index}"
    if not isinstance(msgs, list) or not msgs:
        raise ApplyError(f"{where} holds {type(msgs).__name__}, not a non-empty list of {{role, content}} messages")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ApplyError(f'{where}: message {m!r} is not {{"role": str, "content": str}}')
        out.append({"role": m["role"], "content": m["content"]})
    return out


def conversation_segments(messages: list[dict[str, str]], render: Callable[[list, bool], str], train_on_prompt: bool) -> Segments:
    """Split a rendered conversation into masked text and trained assistant turns."""
    if train_on_prompt:
        return [(render(messages, False), True)]
    out: Segments = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(messages[:i], True)
        after = render(messages[: i + 1], False)
        if not before.startswith(done) or not after.startswith(before):
            raise ApplyError(
                "the chat template does not render a conversation as a prefix of its continuation, so the "
                'assistant turns cannot be located; use data.chat_template = "chatml" or set '
                "data.train_on_prompt = true"
            )
        out += [(before[len(done) :], False), (after[len(before) :], True)]
        done = after
    rest = render(messages, False)[len(done) :]
    if rest:
        out.append((rest, False))
    return [(t, trained) for t, trained in out if t]


def formatter(plan: Plan, tokenizer: Any) -> Formatter:
    fmt = plan.resolved.data.format
    on_prompt = plan.resolved.data.train_on_prompt
    if fmt == "chat":
        field = plan.resolved.data.messages_field
        template = chat_template_of(plan, tokenizer)

        def render(msgs: list, gen: bool) -> str:
            try:
                return tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=gen)
            except Exception as e:  # jinja2 TemplateError, or the template's own raise_exception
                raise ApplyError(f"data.chat_template: rendering failed: {e}") from e

        return Formatter(
            fmt, lambda row, i: conversation_segments(_messages(row, field, i), render, on_prompt), (("data.messages_field", field),)
        )
    if fmt == "instruction":
        pf, rf = plan.resolved.data.prompt_field, plan.resolved.data.response_field
        template = plan.resolved.data.prompt_template
        eos = tokenizer.eos_token or ""

        def instruction(row: dict[str, Any], i: int) -> Segments:
            def text(key: str, col: str) -> str:
                v = row.get(col)
                if not isinstance(v, str):
                    raise ApplyError(f"{key} = {col!r}: row {i} holds {type(v).__name__}, not text")
                return v

            p, r = text("data.prompt_field", pf), text("data.response_field", rf)
            return [(template.replace("{prompt}", p), on_prompt), (r + eos, True)]

        return Formatter(fmt, instruction, (("data.prompt_field", pf), ("data.response_field", rf)))
    return text_formatter(plan.resolved.data.text_field)


def text_formatter(field: str) -> Formatter:
    """Plain text: every token of the field is trained."""
    return Formatter("text", lambda row, i: [(row[field], True)] if isinstance(row.get(field), str) else [], (("data.text_field", field),))


def tokenize_segments(segments: Segments, tokenizer: Any) -> tuple[list[int], list[bool]]:
    """Token ids of the segments' text tokenized once, and whether each id is trained.

    One tokenization of the whole rendered text gives the ids apply_chat_template(tokenize=True)
    gives: tokenizing each segment on its own would let a SentencePiece / Metaspace tokenizer
    (Llama-2, Mistral, TinyLlama) prepend "▁" at every segment start. A token is trained when
    its characters overlap a trained span, the rule of transformers' return_assistant_tokens_mask
    (char_to_token of a span's first and last character, tokenization_utils_base.apply_chat_template).
    """
    text = "".join(t for t, _ in segments)
    flags: list[bool] = []  # per character: inside a trained segment
    for t, on in segments:
        flags += [on] * len(t)
    if not text:
        return [], []
    if getattr(tokenizer, "is_fast", False):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        trained = [any(flags[s:e]) if e > s else flags[min(s, len(flags) - 1)] for s, e in enc["offset_mapping"]]
        return ids, trained
    return _by_prefixes(segments, text, tokenizer)


def _by_prefixes(segments: Segments, text: str, tokenizer: Any) -> tuple[list[int], list[bool]]:
    """A slow tokenizer (no offsets): the token count of the text up to each segment end marks the spans."""

    def encode(t: str) -> list[int]:
        return list(tokenizer(t, add_special_tokens=False)["input_ids"])

    ids = encode(text)
    trained: list[bool] = []
    end = 0
    for t, on in segments:
        end += len(t)
        upto = len(encode(text[:end])) if end < len(text) else len(ids)
        trained += [on] * max(0, min(upto, len(ids)) - len(trained))
    return ids, trained + [False] * (len(ids) - len(trained))
