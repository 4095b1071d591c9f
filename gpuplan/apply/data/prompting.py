"""Prompts as the model saw them in training, and where its answer ends.

data.format decides (apply/data/chat.py builds the training text the same way):
- "chat": the conversation so far plus the user's message, rendered with the training's
  chat template (data.chat_template, else the tokenizer's) and its generation prompt;
  the answer ends where the template closes an assistant turn (ChatML: "<|im_end|>").
- "instruction": data.prompt_template with {prompt} filled in; the answer ends at eos,
  which training appended to every response. Earlier turns go before it as they would
  have been trained: prompt, response, eos.
- "text": the prompt as it is; the model continues it.
Token ids: every training segment was tokenized with add_special_tokens=False
(apply/data/chat.py tokenize_segments, apply/data/prepare.py with packing), so prompts are too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuplan.plan.types import Plan

_PROBE = "\x00gpuplan-end-of-turn\x00"


@dataclass(frozen=True)
class Prompting:
    """How one run turns a conversation into the text it continues."""

    fmt: str  # "text" | "chat" | "instruction"
    template: str | None  # the chat template (chat), or data.prompt_template (instruction)
    stop: str | None  # the text that closes an assistant turn (chat), else None: eos ends it
    add_special_tokens: bool  # False when training tokenized without special tokens

    def render(self, tokenizer: Any, turns: list[dict[str, Any]]) -> str:
        """The text to continue: `turns` ({role, content}, ending with the user's) rendered."""
        if self.fmt == "chat":
            return tokenizer.apply_chat_template(turns, chat_template=self.template, tokenize=False, add_generation_prompt=True)
        if self.fmt == "instruction":
            assert self.template is not None
            eos = tokenizer.eos_token or ""
            done = "".join(self.template.replace("{prompt}", u["content"]) + a["content"] + eos for u, a in zip(turns[:-1:2], turns[1::2]))
            return done + self.template.replace("{prompt}", turns[-1]["content"])
        return "".join(t["content"] for t in turns)

    def answer(self, generated: str) -> str:
        """The generated text up to the end of the turn."""
        if self.stop and self.stop in generated:
            return generated[: generated.index(self.stop)]
        return generated


def prompting(plan: Plan, tokenizer: Any) -> Prompting:
    fmt = plan.resolved.data.format
    if fmt == "chat":
        from gpuplan.apply.data.chat import chat_template_of

        template = chat_template_of(plan, tokenizer)
        return Prompting(fmt, template, end_of_turn(tokenizer, template), False)
    if fmt == "instruction":
        return Prompting(fmt, plan.resolved.data.prompt_template, None, False)
    return Prompting(fmt, None, None, not plan.resolved.data.packing)


def end_of_turn(tokenizer: Any, template: str) -> str | None:
    """What the template writes after an assistant message (ChatML: "<|im_end|>"), stripped."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}], chat_template=template, tokenize=False
    )
    after = text[text.index(_PROBE) + len(_PROBE) :].strip() if _PROBE in text else ""
    eos = tokenizer.eos_token
    if eos and after.startswith(eos):
        return None  # eos ends the turn: generate stops there itself
    return after or None
