"""The special tokens a tokenizer's post-processor puts around one sequence (BOS, CLS/SEP, ...).

Text packing and the instruction format tokenize with add_special_tokens=False (packing
adds its own separator; the prompt and response are tokenized as one text), so they add
the tokens the post-processor would have added themselves: Llama, Mistral and Gemma
tokenizers put their bos_token first (Gemma's model card: "the BOS token is required"),
GPT-2's adds nothing, BERT's wraps in [CLS] ... [SEP]. Read from the tokenizer itself, by
encoding one probe text with and without special tokens: the ids around the bare
encoding are the post-processor's. transformers' run_clm.py / run_mlm.py tokenize
documents with special tokens before grouping them the same way.
"""

from __future__ import annotations

from typing import Any

PROBE = "a"


def affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(ids before, ids after) one sequence, as tokenizer(text) adds them; ([], []) when it adds none."""
    full = list(tokenizer(PROBE)["input_ids"])
    bare = list(tokenizer(PROBE, add_special_tokens=False)["input_ids"])
    for i in range(len(full) - len(bare) + 1):
        if full[i : i + len(bare)] == bare:
            return full[:i], full[i + len(bare) :]
    return [], []


def document_tail(tokenizer: Any, suffix: list[int]) -> list[int]:
    """What ends a packed document: the post-processor's suffix when it has one, else eos (if any)."""
    if suffix:
        return suffix
    return [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
