"""What the model will see: the first rows of the training data as trained / masked text, and statistics.

The same tokenizer, formatter and truncation as apply (data.py, chat.py, examples.py), so
the segments are decoded from the token ids and labels the run trains on. Returned as
the dict `gpuplan data --json` prints:
{"examples": [{"row": int, "tokens": int, "truncated": bool, "segments": [{"text", "trained"}]}],
 "stats": {...}}.
"""

from __future__ import annotations

from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.types import Plan


def preview(plan: Plan, n_examples: int) -> dict[str, Any]:
    from gpuplan.apply.data.chat import formatter, text_formatter
    from gpuplan.apply.data.examples import build, segments_of
    from gpuplan.apply.data.prepare import cache_dir, check_field, load_rows, text_field_of, train_paths
    from gpuplan.apply.data.tokenizer import load_tokenizer

    task = plan.resolved.model.task
    if task != "causal-lm":
        raise ApplyError(
            f"gpuplan data shows causal-lm data; model.task = {task!r} trains on labels or masks drawn at random, nothing to mark"
        )
    from gpuplan.apply.train.execute import fetch_hub_files
    from gpuplan.hub.fetch import model_dir as hub_model_dir

    fetch_hub_files(plan)
    from gpuplan.apply.model.vision import is_vision_language

    if is_vision_language(plan):  # chat rows with images, through the processor (vision.py)
        from gpuplan.apply.data.vision import preview_vision

        return preview_vision(plan, n_examples)
    tokenizer = load_tokenizer(
        hub_model_dir(plan.resolved.model.hub),
        task=task,
        from_scratch=plan.resolved.model.from_scratch,
        trust_remote_code=plan.resolved.model.trust_remote_code,
    )
    from gpuplan.apply.train.preference import uses_preference
    from gpuplan.apply.train.rl import preview_prompts, uses_rl

    if uses_rl(plan):  # prompts as TRL renders them; the completions are what the run generates (rl.py)
        return preview_prompts(plan, tokenizer, n_examples)
    if uses_preference(plan):  # chosen and rejected, as TRL tokenizes them (preference_preview.py)
        from gpuplan.apply.data.preference_preview import preview_preference

        return preview_preference(plan, tokenizer, n_examples)
    paths = train_paths(plan)
    raw, builder = load_rows(paths, "data.train_files", cache_dir(plan))
    fmt = formatter(plan, tokenizer)
    if fmt.fmt == "text":  # a text file's single column is "text" whatever data.text_field says
        fmt = text_formatter(text_field_of(plan, builder))
    for key, column in fmt.fields:
        check_field(raw, column, key, paths, builder)
    seq_len = plan.resolved.data.seq_len
    packing = plan.resolved.data.packing
    if fmt.fmt == "text" and packing:
        return _text_packed(raw, fmt, tokenizer, seq_len, n_examples)
    kept, _, stats = build(raw, fmt, tokenizer, seq_len, packing)
    examples = [
        {"tokens": len(r["input_ids"]), "truncated": bool(r["truncated"]), "segments": segments_of(r["input_ids"], r["trained"], tokenizer)}
        for r in kept.select(range(min(n_examples, len(kept))))
    ]
    return {"examples": examples, "stats": stats.to_dict()}


def _text_packed(raw: Any, fmt: Any, tokenizer: Any, seq_len: int, n_examples: int) -> dict[str, Any]:
    """Plain text, packed: documents (BOS + each + eos) concatenated and cut into seq_len blocks, all trained."""
    from gpuplan.apply.data.examples import segments_of, tokenize_rows
    from gpuplan.apply.data.specials import affixes, document_tail

    tok = tokenize_rows(raw, fmt, tokenizer, 1 << 62)  # each row led by the tokenizer's BOS, as data.py packs it
    eos = document_tail(tokenizer, affixes(tokenizer)[1])
    lengths = [len(x) + len(eos) for x in tok["input_ids"] if x]
    total = sum(lengths)
    sequences = total // seq_len
    examples = [
        {
            "tokens": len(r["input_ids"]) + len(eos),
            "truncated": False,
            "segments": segments_of(r["input_ids"] + eos, [True] * (len(r["input_ids"]) + len(eos)), tokenizer),
        }
        for r in tok.select(range(min(n_examples, len(tok))))
    ]
    stats = {
        "rows": len(raw),
        "examples": len(lengths),
        "dropped_rows": len(raw) - len(lengths),
        "truncated_rows": 0,
        "tokens": sequences * seq_len,
        "trained_tokens": sequences * seq_len,
        "sequences": sequences,
        "seq_len": seq_len,
        "packing": True,
        "packing_efficiency": 1.0 if sequences else None,
        "dropped_tail_tokens": total - sequences * seq_len,
    }
    if not sequences:
        raise ApplyError(f"data.train_files holds {total} tokens, fewer than data.seq_len = {seq_len}")
    return {"examples": examples, "stats": stats}
