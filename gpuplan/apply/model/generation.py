"""Generation with a model in the template it trained on: one prompt, a list of prompts, or a conversation.

It runs while the model trains ([eval] sample_prompts, apply/train/samples.py) and after the run
(`gpuplan generate` / `chat`, with after/load.py's model), so it sits in apply/, below after/.

Greedy decoding at temperature 0 (the default: the same text every time), sampling
above it, seeded by `seed`. A turn ends at eos, at the template's end of turn
(prompting.py), or after max_new_tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from gpuplan.apply.data.prompting import Prompting


@dataclass
class Loaded:
    """A model in memory with its tokenizer: the one being trained, or a finished run's (after/load.py)."""

    model: Any
    tokenizer: Any
    device: str  # "cuda" | "cpu"
    what: str  # one line: what was loaded, for the user
    autocast_dtype: Any  # torch dtype under training.bf16 / fp16 on CUDA, else None
    processor: Any = None  # a vision-language model's AutoProcessor (its tokenizer is `tokenizer`)

    def autocast(self) -> Any:
        import torch

        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device, dtype=self.autocast_dtype)


DEFAULT_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class Generation:
    prompt: str  # what the user wrote
    text: str  # what the model saw (the prompt in the training's template)
    completion: str  # the answer, up to the end of its turn
    new_tokens: int


def _stop_at(tokenizer: Any, stop: str, start: int) -> Any:
    """A StoppingCriteria that ends generation once the new text contains `stop`."""
    from transformers import StoppingCriteria

    class StopText(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            import torch

            done = [stop in tokenizer.decode(row[start:], skip_special_tokens=False) for row in input_ids]
            return torch.tensor(done, device=input_ids.device)

    return StopText()


def generate(
    loaded: Loaded,
    prompting: Prompting,
    turns: list[dict[str, str]],
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    temperature: float = 0.0,
    seed: int = 0,
    images: list[str] | None = None,
) -> Generation:
    """The model's answer to the last of `turns` ({role, content}; the last is the user's), with
    `images` (files) before the text of the first user turn for a vision-language model (its processor)."""
    import torch
    from transformers import StoppingCriteriaList, set_seed

    tok, model = loaded.tokenizer, loaded.model
    pixels: dict[str, Any] = {}
    if images:
        from gpuplan.apply.data.vision import open_images

        if loaded.processor is None:
            from gpuplan.errors import UserError

            raise UserError("--image needs a vision-language model; this run trained a text model", fix="drop --image")
        first = next(i for i, t in enumerate(turns) if t["role"] == "user")  # the images open the conversation
        parts = [*({"type": "image"} for _ in images), {"type": "text", "text": turns[first]["content"]}]
        with_images: list[dict[str, Any]] = [*turns[:first], {"role": "user", "content": parts}, *turns[first + 1 :]]
        text = prompting.render(tok, with_images)
        enc = loaded.processor(
            text=[text], images=[open_images(images)], return_tensors="pt", add_special_tokens=prompting.add_special_tokens
        )
        pixels = {k: v.to(loaded.device) for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
    else:
        text = prompting.render(tok, turns)
        enc = tok(text, return_tensors="pt", add_special_tokens=prompting.add_special_tokens)
    ids = enc["input_ids"].to(loaded.device)
    if ids.shape[1] == 0:  # a text run with an empty prompt: start from bos, as a document would
        start_id = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        ids = torch.tensor([[start_id]], device=loaded.device)
    mask = torch.ones_like(ids)
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "use_cache": True,
    }
    if temperature > 0:
        set_seed(seed)
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    if prompting.stop:
        kwargs["stopping_criteria"] = StoppingCriteriaList([_stop_at(tok, prompting.stop, ids.shape[1])])
    with torch.no_grad(), loaded.autocast():
        out = model.generate(input_ids=ids, attention_mask=mask, **pixels, **kwargs)
    new = out[0, ids.shape[1] :]
    generated = tok.decode(new, skip_special_tokens=True)
    return Generation(turns[-1]["content"], text, prompting.answer(generated), int(new.shape[0]))


def check_causal(task: str, command: str) -> None:
    if task != "causal-lm":
        from gpuplan.errors import UserError

        raise UserError(
            f"{command} generates text: it needs a causal-lm run, and this run's model.task is {task!r}",
            key="model.task",
            fix="use gpuplan eval SPEC to score a seq-cls or masked-lm model",
        )
