"""Plan-time check that the rows of a supervised run hold the fields the spec names.

Apply reads data.text_field (data.format = "text"), data.messages_field ("chat"),
data.prompt_field / data.response_field ("instruction") and, for model.task = "seq-cls",
data.label_field from each row (apply/data/prepare.py check_field, apply/data/chat.py formatter), and
refuses a field that no row has ("no such field"). Preference pairs (prompt / chosen /
rejected) under the default SFT objective and data.text_field = "text" used to plan and
then fail that way; the plan now reads the first rows of local .jsonl / .json / .csv files
(data_format.py read_rows, SAMPLE_ROWS of them: cheap, whatever the file's size) and
refuses a field none of them has, naming the fields they do have and the keys that read
them (data_format.py detect_format, the one place that maps row shapes to data.* keys).
A .txt file's one field is always "text" (datasets' text builder; apply reads it whatever
data.text_field says), parquet files and Hub datasets are checked by apply, which has the rows.

Preference objectives read their own fields (plan/checks/preference_rows.py), so this check
is for SFT only. Called by plan/build.py check with the spec's settings. Stdlib only: no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.spec.data_format import detect_format, read_rows

READ = (".jsonl", ".json", ".csv")  # the files whose first rows the plan reads (stdlib)
_MISSING = object()


def fields_read(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, field) pairs an SFT run reads from each row, as apply/data/prepare.py and apply/data/chat.py do."""
    fmt = values.get("data.format") or "text"
    if fmt == "chat":
        return [("data.messages_field", values["data.messages_field"])]
    if fmt == "instruction":
        return [("data.prompt_field", values["data.prompt_field"]), ("data.response_field", values["data.response_field"])]
    out = [("data.text_field", values["data.text_field"])]
    if values.get("model.task") == "seq-cls" and values.get("data.label_field"):
        out.append(("data.label_field", values["data.label_field"]))
    return out


def _toml(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def _fix(rows: list[Any], key: str, present: list[str], path: str, chat_template_missing: bool) -> str:
    """Keys that read these rows, from detect_format; else (and for the label): name one of the fields present."""
    pick = f"set {key} to one of the fields the rows have ({', '.join(present)}), or rename the rows' fields"
    if key == "data.label_field":
        return pick
    try:
        fmt = detect_format(rows, path)
    except GpuplanError:
        return pick
    values = dict(fmt.values)
    if values.get("data.format") == "chat" and chat_template_missing:
        values["data.chat_template"] = "chatml"
    keys = ", ".join(f"{k} = {_toml(v)}" for k, v in values.items())
    if fmt.objective is not None:
        fields = "prompt / chosen / rejected" if fmt.objective == "dpo" else "prompt / completion / label"
        return f"these are {fmt.objective} rows ({fields}): set {keys} to train on them as preference data"
    return f"set {keys} (what the rows hold), or rename the rows' fields"


def data_field_problems(values: Mapping[str, Any], chat_template_missing: bool = False) -> list[Diagnostic]:
    """One error per (file, key) whose field none of the file's first rows has.

    `values` holds the spec's data.* keys, model.task and training.objective (data.train_files /
    data.eval_files resolved to paths); `chat_template_missing`: the model's tokenizer has no chat
    template and data.chat_template is unset (so a chat fix must name one)."""
    if (values.get("training.objective") or "sft") != "sft":
        return []
    wanted = fields_read(values)
    out = []
    for files_key in ("data.train_files", "data.eval_files"):
        for i, path in enumerate(values.get(files_key) or []):
            if os.path.splitext(path)[1].lower() not in READ or not os.path.isfile(path) or os.path.getsize(path) == 0:
                continue  # missing / empty files: data_files.py; .txt always has "text"; others: apply
            try:
                rows = [r for r in read_rows(Path(path)) if isinstance(r, Mapping)]
            except GpuplanError:
                continue  # not readable as rows: apply says so with datasets' own message
            if not rows:
                continue
            present = list(dict.fromkeys(c for r in rows for c in r))
            for key, field in wanted:
                if all(r.get(field, _MISSING) is _MISSING for r in rows):
                    where = f"{files_key}[{i}]"
                    out.append(
                        Diagnostic(
                            "error",
                            key,
                            f"{key} = {field!r}: none of the first {len(rows)} rows of {path} ({where}) has that field; "
                            f"they have {', '.join(map(repr, present)) or 'no fields'}",
                            detail=f"apply reads {key} from every row and refuses a field the rows do not have",
                            fix=_fix(rows, key, present, path, chat_template_missing),
                        )
                    )
    return out
