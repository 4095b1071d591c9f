"""`gpuplan init --data`: read the first rows of a data file and tell its format from them.

`detect_format(rows)` is the one place that maps row shapes to data.* keys (the hook for
new formats): plain text, chat messages ({role, content} lists), instruction/response
pairs, and preference pairs (prompt, chosen, rejected). The file types are apply's
(apply/data.py BUILDERS: datasets' text, json, csv and parquet builders). Stdlib only,
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
SUFFIXES = (".txt", ".text", ".jsonl", ".json", ".csv", ".parquet")  # apply/data.py BUILDERS
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


def _fail(source: str, summary: str, fix: str | None = None) -> GpuplanError:
    return GpuplanError([Diagnostic("error", "data.train_files", f"--data {source}: {summary}", fix=fix)])


def read_rows(path: Path, source: str | None = None, n: int = SAMPLE_ROWS) -> list[dict[str, Any]]:
    """The first `n` rows of a data file, as datasets' builder for its suffix would read them."""
    source = source or str(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise _fail(source, f"suffix {suffix or '(none)'!r} is not a data file gpuplan reads", fix=f"give a {', '.join(SUFFIXES)} file")
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
        raise _fail(source, f"cannot read it: {getattr(e, 'strerror', None) or e}") from None
    except ImportError:
        raise _fail(source, "reading parquet needs pyarrow", fix="pip install pyarrow (datasets installs it)") from None


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
                    raise _fail(source, f"not valid JSON (line {e.lineno}: {e.msg})") from None
                return list(array[:n]) if isinstance(array, list) else []
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise _fail(source, f"line {i} is not JSON ({e.msg}); a .jsonl file holds one JSON object per line") from None
            if len(rows) == n:
                break
    return rows


def detect_format(rows: Sequence[Any], source: str) -> DataFormat:
    """The format of `rows` (dicts of column -> value), with the data.* keys that read it."""
    rows = [r for r in rows if isinstance(r, Mapping)]
    if not rows:
        raise _fail(source, "holds no rows of named columns (JSON objects, CSV with a header, text lines)")
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
    raise _fail(
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
        raise _fail(
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


def data_source(data: str, *, cwd: Path, spec_dir: Path) -> tuple[dict[str, Any], DataFormat]:
    """`--data`: a local file (written into data.train_files, relative to the spec) or a Hub
    dataset id (data.dataset, resolved as plan resolves it); its rows give the format."""
    from gpuplan.hub.ids import is_hub_id
    from gpuplan.spec.model_source import relative

    path = Path(data) if Path(data).is_absolute() else cwd / data
    if path.exists() or data.lower().endswith(SUFFIXES) or not is_hub_id(data, cwd):
        if not path.is_file():
            raise _fail(
                data,
                "no such file" if not path.exists() else "is not a file",
                fix=f"give a data file ({', '.join(SUFFIXES)}) or a Hub dataset id (org/name)",
            )
        fmt = detect_format(read_rows(path, data), data)
        return {"data.train_files": [relative(path, spec_dir)], **fmt.values}, fmt
    file, shown, split = _hub_data_file(data, cwd)
    fmt = detect_format(read_rows(file, shown), data)
    if split is None:
        return {"data.dataset": data, **fmt.values}, fmt
    notes = {
        **fmt.notes,
        "data.split": f'The dataset card of {data} maps no "train" split (it has {", ".join(split[1])}): init trains on {split[0]!r}.',
    }
    fmt = DataFormat(fmt.format, fmt.values, fmt.summary, fmt.objective, notes)
    return {"data.dataset": data, "data.split": split[0], **fmt.values}, fmt


def _train_split(splits: dict[str, list[str]], repo_id: str) -> str:
    """The split init trains on: "train" when the card maps it, else the first "train..." one
    (ultrachat_200k: train_sft); raises when the card maps neither."""
    from gpuplan.hub.splits import DEFAULT_SPLIT

    split = DEFAULT_SPLIT if DEFAULT_SPLIT in splits else next((s for s in splits if s.startswith(DEFAULT_SPLIT)), None)
    if split is None:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "data.split",
                    f"--data {repo_id}: its dataset card maps no training split (it has {', '.join(splits)})",
                    fix="run init without --data, then set data.dataset and data.split by hand",
                )
            ]
        )
    return split


def _hub_data_file(repo_id: str, cwd: Path) -> tuple[Path, str, tuple[str, list[str]] | None]:
    """The first data file of a Hub dataset's training split: resolved as plan resolves data.dataset,
    the split's files picked by the card's configs as apply picks them (hub/splits.py), from the
    cache (downloaded otherwise, as apply would). The third item: (the split, the card's splits)
    when the card maps no "train" split, else None."""
    import os

    from gpuplan.hub.fetch import DATA_PATTERNS, DATA_SUFFIXES, data_files_in
    from gpuplan.hub.resolve import README, HubError, resolve, snapshot
    from gpuplan.hub.splits import DEFAULT_SPLIT, card_configs, fetch_patterns, matching, split_map

    key = "data.dataset"
    try:
        ref = resolve(key, repo_id, "dataset", "main", None)
        readme = os.path.join(ref.path, README)
        configs = card_configs(readme) if os.path.isfile(readme) else []
        splits = split_map(configs) if configs else {}
        split = _train_split(splits, repo_id) if splits else None
        patterns = fetch_patterns(splits[split]) if split is not None else DATA_PATTERNS
        folder = snapshot(key, repo_id, "dataset", ref.commit, patterns + [README])
    except HubError as e:  # the Diagnostic plan/inputs/sources.py makes for the same failure
        raise GpuplanError(
            [
                Diagnostic(
                    "error", key, e.message, detail=f"--data {repo_id} is read as a Hub id: no local path {cwd / repo_id} exists", fix=e.fix
                )
            ]
        ) from None
    files = data_files_in(folder)
    if split is not None:
        files = matching(folder, files, splits[split])
    if not files:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    key,
                    f"--data {repo_id}: the dataset at {ref.commit[:12]} holds no data files ({', '.join(DATA_SUFFIXES)}) in {folder}",
                )
            ]
        )
    chosen = (split, list(splits)) if split is not None and split != DEFAULT_SPLIT else None
    return Path(files[0]), f"{repo_id} ({os.path.relpath(files[0], folder)})", chosen
