"""Preference rows checked before anything trains: every unusable row counted, none dropped.

DPO rows are TRL's paired format, prompt / chosen / rejected; KTO rows its unpaired
format, prompt / completion / label (trl/data_utils.py; TRL's dataset formats guide). Each
field is plain text or, conversational, a list of {role, content} messages (data.format =
"chat", rendered by the chat template), all fields of a row in the same form. A row cannot
be used when a field is missing or of the wrong type, when it mixes plain text and messages,
when chosen / rejected / completion is empty, when a KTO label is not a boolean, or when the
prompt has more tokens than preference.max_prompt_length (no room left for the answer).

KTO also reads DPO's paired rows: TRL 1.16's KTOTrainer unpairs a split whose first row has chosen and
rejected (trl/trainer/kto_trainer.py `_prepare_dataset`: "Unpair the dataset if needed", through
trl/data_utils.py `unpair_preference_dataset`): each pair becomes two labelled completions, chosen with
label true and rejected with label false, 2N examples. Such a split is checked row by row as pairs.
`plan` reports them with their count and first row numbers; `apply` runs the same check
with the run's tokenizer before it writes anything. Nothing is silently dropped.

Pure Python (json), no torch: plan reads local .jsonl / .json files; other formats and Hub
datasets are checked by apply, which has the rows.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplan.plan.types import Diagnostic
from gpuplan.spec.objectives import Objective

SHOWN_ROWS = 5  # row numbers listed per problem
PAIRED_FIELDS = ("prompt", "chosen", "rejected")  # a DPO row; KTO unpairs it (see above)
# TRL 1.16 decides whether a row is conversational from one of its fields, whichever a set yields first
# (trl/data_utils.py is_conversational: example_keys.pop()), then renders every field that one way: a row
# with a plain-text prompt and message-list answers is tokenized as neither and the trainer fails.
MIXED = "mixes plain text and lists of messages across its fields"
MIXED_FIX = (
    'write every field of a row in one form: the prompt as a list of messages ([{"role": "user", "content": ...}]) '
    "and each answer as the assistant's turn(s) only, or all of them as plain text"
)


@dataclass
class RowReport:
    rows: int = 0
    problems: Counter = field(default_factory=Counter)  # problem -> rows
    first: dict[str, list[int]] = field(default_factory=dict)  # problem -> first row numbers (0-based)
    conversational: int = 0
    prompts_unmeasured: int = 0  # prompts whose length could not be counted here
    paired: bool = False  # kto: prompt / chosen / rejected rows, unpaired into 2 examples each (see above)

    @property
    def examples(self) -> int:
        """The examples the trainer sees: a KTO pair is two (its chosen and its rejected completion)."""
        return 2 * self.rows if self.paired else self.rows

    def add(self, problem: str, row: int) -> None:
        self.problems[problem] += 1
        self.first.setdefault(problem, [])
        if len(self.first[problem]) < SHOWN_ROWS:
            self.first[problem].append(row)

    @property
    def unusable(self) -> int:
        return sum(self.problems.values())


def _is_messages(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in v)
    )


def _empty(v: Any) -> bool:
    if isinstance(v, str):
        return not v.strip()
    if isinstance(v, list):
        return not v or all(not str(m.get("content", "")).strip() for m in v if isinstance(m, dict))
    return False


def check_rows(
    rows: Iterable[Mapping[str, Any]], obj: Objective, max_prompt_tokens: int, prompt_tokens: Callable[[Any], int | None]
) -> RowReport:
    """Count the unusable rows of a preference split. `prompt_tokens(prompt)` is the prompt's length
    in tokens, or None when it cannot be measured (a conversational prompt at plan time)."""
    report = RowReport()
    rows = list(rows)
    fields = obj.example_fields
    if obj.name == "kto" and rows and isinstance(rows[0], Mapping) and "chosen" in rows[0] and "rejected" in rows[0]:
        report.paired, fields = True, PAIRED_FIELDS  # TRL's test: the first example (kto_trainer.py _prepare_dataset)
    answers = tuple(f for f in fields if f not in ("prompt", "label"))
    for i, row in enumerate(rows):
        report.rows += 1
        if not isinstance(row, Mapping):
            report.add("is not an object with fields", i)
            continue
        missing = [f for f in fields if f not in row or row[f] is None]
        if missing:
            report.add(f"has no {' / '.join(missing)}", i)
            continue
        values = [row["prompt"], *(row[f] for f in answers)]
        if not all(isinstance(v, str) or _is_messages(v) for v in values):
            report.add("holds a field that is neither text nor a list of {role, content} messages", i)
            continue
        kinds = {isinstance(v, list) for v in values}
        if len(kinds) > 1:  # UltraFeedback's layout: a plain prompt, message-list answers
            report.add(MIXED, i)
            continue
        if True in kinds:
            report.conversational += 1
        empty = [f for f in answers if _empty(row[f])]
        if empty:
            report.add(f"has an empty {' / '.join(empty)}", i)
            continue
        if "label" in fields and not isinstance(row["label"], bool):
            report.add("has a label that is not true or false", i)
            continue
        n = prompt_tokens(row["prompt"])
        if n is None:
            report.prompts_unmeasured += 1
        elif n > max_prompt_tokens:
            report.add(f"has a prompt longer than preference.max_prompt_length = {max_prompt_tokens} tokens", i)
    return report


def read_json_rows(path: str) -> list[Any] | None:
    """Rows of a .jsonl / .json file, or None for other formats (apply reads those)."""
    suffix = os.path.splitext(path)[1].lower()
    try:
        with open(path, encoding="utf-8") as f:
            if suffix == ".jsonl":
                return [json.loads(line) for line in f if line.strip()]
            if suffix == ".json":
                data = json.load(f)
                return data if isinstance(data, list) else None
    except (OSError, ValueError):
        return None  # unreadable: data_file_problems or apply says so
    return None


def plain_prompt_counter(tokenizer_file: str | None, byte_level: bool) -> Callable[[Any], int | None]:
    """Token count of a plain-text prompt with the model's tokenizer.json (the `tokenizers` library,
    no torch; its post-processor adds the special tokens, as trl/data_utils.py `_tokenize` does), or
    the byte-level tokenizer's one id per UTF-8 byte (it adds none); None for conversational prompts."""
    encode: Callable[[str], int] | None = None
    if byte_level:

        def encode(text: str) -> int:
            return len(text.encode("utf-8"))
    elif tokenizer_file and os.path.isfile(tokenizer_file):
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(tokenizer_file)

            def encode(text: str) -> int:
                return len(tok.encode(text).ids)  # with the special tokens, as TRL tokenizes a prompt
        except Exception:  # a tokenizer.json this `tokenizers` cannot read: apply measures it
            encode = None

    def count(prompt: Any) -> int | None:
        return encode(prompt) if encode is not None and isinstance(prompt, str) else None

    return count


def report_diagnostics(report: RowReport, key: str, where: str, obj: Objective) -> list[Diagnostic]:
    """One error per kind of unusable row, with its count and first row numbers."""
    out = []
    for problem, n in report.problems.items():
        rows = ", ".join(str(r) for r in report.first[problem]) + (", ..." if n > SHOWN_ROWS else "")
        if "max_prompt_length" in problem:
            fix = "raise preference.max_prompt_length, or shorten or remove those rows"
        elif problem == MIXED:
            fix = MIXED_FIX
        elif report.paired:  # kto on pairs: the first row made the split paired, as TRL decides
            fix = f"fix or remove those rows: row 0 makes this a split of pairs, and a {obj.name} pair has {' / '.join(PAIRED_FIELDS)}"
        else:
            fix = f"fix or remove those rows: a {obj.name} row has {' / '.join(obj.example_fields)}"
        out.append(
            Diagnostic(
                "error",
                key,
                f"{key}: {n} of {report.rows} {obj.name} rows in {where} {problem} (rows {rows})",
                detail="gpuplan drops no row silently: every row is trained on or reported",
                fix=fix,
            )
        )
    return out
