"""The prompt rows of an online RL run (grpo / rloo), read at plan time from local .jsonl / .json files.

TRL 1.16's GRPOTrainer and RLOOTrainer read a "prompt" column: plain text, or a list of {role, content}
messages it renders with the chat template (trl/data_utils.py maybe_apply_chat_template, is_conversational).
Every other column reaches the reward functions as a keyword, one value per completion
(trl/trainer/grpo_trainer.py `_calculate_rewards`). So a row is usable when its prompt is there, not empty,
and no longer than rl.max_prompt_length tokens (TRL 1.16 has no prompt truncation: GRPOConfig has no
max_prompt_length; the plan sizes memory and time for that many tokens), and it holds every column a reward
reads (an exact-match reward's `column`, a function's required parameters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplan.plan.checks.preference_rows import SHOWN_ROWS, _is_messages


@dataclass
class PromptReport:
    rows: int = 0
    no_prompt: list[int] = field(default_factory=list)  # row numbers (0-based), first SHOWN_ROWS
    no_prompt_count: int = 0
    too_long: list[int] = field(default_factory=list)
    too_long_count: int = 0
    longest: int = 0  # longest plain prompt measured, tokens
    conversational: int = 0
    unmeasured: int = 0
    columns: tuple[str, ...] = ()  # columns every row has
    missing: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # column -> (rows without it, first rows)


def _add(rows: list[int], i: int) -> None:
    if len(rows) < SHOWN_ROWS:
        rows.append(i)


def check_prompts(rows: list[Any], needed: tuple[str, ...], max_prompt: int | None, count: Callable[[Any], int | None]) -> PromptReport:
    """Count the unusable rows of a split; `needed`: the columns the rewards read."""
    r = PromptReport(rows=len(rows))
    common: set[str] | None = None
    missing: dict[str, list[Any]] = {c: [0, []] for c in needed}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            r.no_prompt_count += 1
            _add(r.no_prompt, i)
            continue
        keys = set(row)
        common = keys if common is None else common & keys
        for c in needed:
            if c not in row or row[c] is None:
                missing[c][0] += 1
                if len(missing[c][1]) < SHOWN_ROWS:
                    missing[c][1].append(i)
        prompt = row.get("prompt")
        if _is_messages(prompt):
            r.conversational += 1
            r.unmeasured += 1
            continue
        if not isinstance(prompt, str) or not prompt.strip():
            r.no_prompt_count += 1
            _add(r.no_prompt, i)
            continue
        n = count(prompt)
        if n is None:
            r.unmeasured += 1
            continue
        r.longest = max(r.longest, n)
        if max_prompt is not None and n > max_prompt:
            r.too_long_count += 1
            _add(r.too_long, i)
    r.columns = tuple(sorted(common or ()))
    r.missing = {c: (n, first) for c, (n, first) in missing.items() if n}
    return r


def _rows(first: list[int], n: int) -> str:
    shown = ", ".join(str(i + 1) for i in first)
    return f"row{'s' if n > 1 else ''} {shown}{', ...' if n > len(first) else ''}"
