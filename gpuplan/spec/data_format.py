"""The first rows of a data file and the format they are in (gpuplan init --data, the plan's row checks).

`detect_format(rows)` is the one place that maps row shapes to data.* keys (the hook for
new formats): plain text, chat messages ({role, content} lists), instruction/response
pairs, and preference pairs (prompt, chosen, rejected). The file types are apply's
(apply/data/prepare.py BUILDERS: datasets' text, json, csv and parquet builders). Stdlib only,
pyarrow only for a parquet file; never torch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.spec.schema import SECTIONS

SAMPLE_ROWS = 20
SUFFIXES = (".txt", ".text", ".jsonl", ".json", ".csv", ".parquet")  # apply/data/prepare.py BUILDERS
# (prompt column, response column) pairs in the order they are tried: gpuplan's own names,
# Alpaca's instruction/output, OpenAI-style prompt/completion, QA sets' question/answer.
INSTRUCTION_PAIRS = (
    ("prompt", "response"),
    ("instruction", "output"),
    ("instruction", "response"),
    ("prompt", "completion"),
    ("question", "answer"),
    ("input", "output"),
)
TEXT_FIELDS = ("text", "content", "document", "body")
PREFERENCE = ("prompt", "chosen", "rejected")  # TRL's DPOTrainer dataset columns (trl docs, "Dataset formats")


@dataclass(frozen=True)
class DataFormat:
    format: str  # "text" | "chat" | "instruction" | "preference"
    values: dict[str, Any]  # spec keys and the values init writes
    summary: str  # what the rows showed: the comment above data.format
    objective: str | None = None  # the objective the rows are made for ("dpo"); None: supervised
    notes: dict[str, str] = field(default_factory=dict)  # comments above other keys


def data_error(source: str, summary: str, fix: str | None = None) -> GpuplanError:
    return GpuplanError([Diagnostic("error", "data.train_files", f"--data {source}: {summary}", fix=fix)])


def read_rows(path: Path, source: str | None = None, n: int = SAMPLE_ROWS) -> list[dict[str, Any]]:
    """The first `n` rows of a data file, as datasets' builder for its suffix would read them."""
    source = source or str(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise data_error(
            source, f"suffix {suffix or '(none)'!r} is not a data file gpuplan reads", fix=f"give a {', '.join(SUFFIXES)} file"
        )
    try:
        if suffix in (".txt", ".text"):  # datasets' text builder: one row per line, column "text"
            with path.open(encoding="utf-8") as f:
                return [{"text": line.rstrip("\n")} for line, _ in zip(f, range(n))]
        if suffix == ".csv":
            with path.open(encoding="utf-8", newline="") as f:
                return [dict(r) for r, _ in zip(csv.DictReader(f), range(n))]
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            batch = next(pq.ParquetFile(path).iter_batches(batch_size=n), None)
            return [] if batch is None else batch.to_pylist()
        return _json_rows(path, source, n)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise data_error(source, f"cannot read it: {getattr(e, 'strerror', None) or e}") from None
    except ImportError:
        raise data_error(source, "reading parquet needs pyarrow", fix="pip install pyarrow (datasets installs it)") from None


def _json_rows(path: Path, source: str, n: int) -> list[dict[str, Any]]:
    """JSON lines, or one JSON array of objects (datasets' json builder reads both)."""
    rows: list[Any] = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not rows and line.lstrip().startswith("["):  # an array: parse the whole file
                try:
                    array = json.loads(path.read_text(encoding="utf-8"))
                except json.JSONDecodeError as e:
                    raise data_error(source, f"not valid JSON (line {e.lineno}: {e.msg})") from None
                return list(array[:n]) if isinstance(array, list) else []
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise data_error(source, f"line {i} is not JSON ({e.msg}); a .jsonl file holds one JSON object per line") from None
            if len(rows) == n:
                break
    return rows


def detect_format(rows: Sequence[Any], source: str) -> DataFormat:
    """The format of `rows` (dicts of column -> value), with the data.* keys that read it."""
    rows = [r for r in rows if isinstance(r, Mapping)]
    if not rows:
        raise data_error(source, "holds no rows of named columns (JSON objects, CSV with a header, text lines)")
    cols = [c for c in rows[0] if all(c in r for r in rows)]
    strings = [c for c in cols if all(isinstance(r[c], str) for r in rows)]
    chats = [c for c in cols if all(_is_messages(r[c]) for r in rows)]
    if all(c in cols for c in PREFERENCE):
        return preference_format(rows, cols, chats)
    if all(c in cols for c in KTO) and all(isinstance(r["label"], bool) for r in rows):
        return kto_format(cols, chats)
    if chats:
        c = "messages" if "messages" in chats else chats[0]
        return DataFormat(
            "chat",
            {"data.format": "chat", "data.messages_field": c},
            f"Read from the rows: column {c!r} holds lists of {{role, content}} messages (chat).",
        )
    for prompt, response in INSTRUCTION_PAIRS:
        if prompt in strings and response in strings:
            unused = [c for c in cols if c not in (prompt, response)]
            more = f"; column(s) {', '.join(unused)} are not read" if unused else ""
            return DataFormat(
                "instruction",
                {"data.format": "instruction", "data.prompt_field": prompt, "data.response_field": response},
                f"Read from the rows: {prompt!r} -> {response!r} pairs (instruction){more}.",
            )
    text = next((c for c in TEXT_FIELDS if c in strings), strings[0] if len(strings) == 1 else None)
    if text is not None:
        return DataFormat("text", {"data.format": "text", "data.text_field": text}, f"Read from the rows: plain text in column {text!r}.")
    raise data_error(
        source,
        f"rows with columns {', '.join(map(repr, cols)) or '(none)'} are none of the formats gpuplan "
        "reads: text (a 'text' column), chat (a 'messages' column of {role, content} lists), "
        "instruction (prompt/response), preference (prompt/chosen/rejected)",
        fix="rename the columns, or write the spec's data keys by hand (gpuplan init without --data)",
    )


KTO = ("prompt", "completion", "label")  # TRL's unpaired preference rows


def kto_format(cols: list[str], chats: list[str]) -> DataFormat:
    """prompt/completion/label rows: KTO's unpaired preference data."""
    seen = "Read from the rows: labelled completions (prompt, completion, label)"
    if SECTIONS["training"].model_fields.get("objective") is None:
        raise data_error(
            "--data",
            f"{seen}: KTO data, and this gpuplan has no training.objective",
            fix="write the spec's data keys by hand (gpuplan init without --data)",
        )
    chat = "completion" in chats
    return DataFormat(
        "preference",
        {"training.objective": "kto", "data.format": "chat" if chat else "text"},
        f"{seen}: trained with KTO" + (" (conversational, rendered with the chat template)." if chat else "."),
        objective="kto",
    )


def preference_format(rows: Sequence[Mapping[str, Any]], cols: list[str], chats: list[str]) -> DataFormat:
    """prompt/chosen/rejected rows. With a preference objective in the schema (training.objective),
    the spec trains on the pairs; without one, on prompt -> chosen, and the comment says so."""
    seen = "Read from the rows: preference pairs (prompt, chosen, rejected)"
    objectives = SECTIONS["training"].model_fields.get("objective")
    if objectives is not None:  # preference tuning exists: the pairs are what it reads
        values = {"training.objective": "dpo", **({"data.format": "chat"} if "chosen" in chats else {})}
        return DataFormat(
            "preference",
            values,
            f"{seen}: trained with DPO" + (" (conversational pairs, rendered with the chat template)." if "chosen" in chats else "."),
            objective="dpo",
        )
    if "chosen" in chats:
        return DataFormat(
            "preference",
            {"data.format": "chat", "data.messages_field": "chosen"},
            f"{seen}. This gpuplan has no preference objective (training.objective): the spec trains "
            "on the chosen conversations as chat data and does not read 'rejected'.",
        )
    return DataFormat(
        "preference",
        {"data.format": "instruction", "data.prompt_field": "prompt", "data.response_field": "chosen"},
        f"{seen}. This gpuplan has no preference objective (training.objective): the spec trains on "
        "prompt -> chosen as instruction data and does not read 'rejected'.",
    )


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)
    )
