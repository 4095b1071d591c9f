"""Chat rows with images from parquet files: the layout of the Hub's image datasets, local or fetched.

A Hub image dataset (HuggingFaceH4/llava-instruct-mix-vsft, the lmms-lab sets, TRL's VLM examples)
is parquet whose rows hold the chat and the images apart:

    messages: [{"role": "user", "content": [{"type": "image", "text": null}, {"type": "text", "text": "What is it?"}]}, ...]
    images:   [{"bytes": b"\\x89PNG...", "path": "cat.png"}]

The images are the `datasets` Image feature's storage, a struct of the encoded file's bytes and a
path (datasets/features/image.py: Image.pa_type = struct<bytes: binary, path: string>; decoding
prefers the bytes and falls back to the path). Each image part of the messages that names no file
is a placeholder for the next entry of the images list, in order (TRL's SFTTrainer pairs them the
same way: the processor gets the row's images with the text whose template writes one image token
per part). A column named "image" holding one struct stands for a list of one. Messages of plain
text contents, which place no image, get the row's images at the start of the first user turn, as
TRL gives them (trl/data_utils.py prepare_multimodal_messages).

`read_image_rows` turns every row into the form spec/chat_images.py reads: each placeholder
becomes {"type": "image", "bytes": ..., "path": ..., "column": "images[k]"} (a null entry gets
"null": true), so the plan (plan/checks/image_rows.py) and apply (apply/data/vision.py) count,
decode and train the same images. A row whose placeholders and images differ in number is
listed, not matched: which image belongs to which part would be a guess.

pyarrow is imported only here, lazily, when a parquet file is read: it is part of the `vision`
extra (pyproject.toml), which planning an image dataset needs anyway for Pillow. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplan.spec.chat_images import IMAGE_KEYS, is_image_part

IMAGES_COLUMNS = ("images", "image")  # a list of Image structs (TRL, lmms-lab), else one (VQA sets)
INSTALL = "pip install 'gpuplan[vision]'"


class ImageRowsError(Exception):
    """A parquet file of image rows that cannot be read as one: the summary says what, the fix what to do."""

    def __init__(self, summary: str, fix: str | None = None):
        super().__init__(summary)
        self.summary = summary
        self.fix = fix


@dataclass(frozen=True)
class Mismatch:
    row: int  # 0-based
    placeholders: int  # image parts naming no file
    images: int  # entries of the row's images column


@dataclass(frozen=True)
class ImageRows:
    rows: list[Any]  # rows with their placeholders filled from the images column
    mismatched: list[Mismatch] = field(default_factory=list)
    images_column: str | None = None  # the column the images came from (None: no placeholder needed one)


def is_parquet(path: str) -> bool:
    return path.lower().endswith(".parquet")


def _placeholders(messages: Any) -> list[Mapping[str, Any]]:
    """The image parts of a row that name no file: each takes the next entry of the images column."""
    out = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, Mapping) else None
        for part in content if isinstance(content, list) else []:
            if is_image_part(part) and not any(isinstance(part.get(k), str) and part[k] for k in IMAGE_KEYS):
                out.append(part)
    return out


def _entry(image: Any, column: str) -> dict[str, Any]:
    """An images column entry as an image part."""
    if image is None:
        return {"type": "image", "column": column, "null": True}
    if isinstance(image, (bytes, bytearray)):  # a binary column
        return {"type": "image", "column": column, "bytes": bytes(image), "path": None}
    if isinstance(image, str):  # a string column: a path
        return {"type": "image", "column": column, "bytes": None, "path": image}
    data = image.get("bytes") if isinstance(image, Mapping) else None
    path = image.get("path") if isinstance(image, Mapping) else None
    return {"type": "image", "column": column, "bytes": data, "path": path if isinstance(path, str) and path else None}


def _fill(messages: list[Any], entries: list[dict[str, Any]]) -> list[Any]:
    """The messages with each placeholder replaced by its entry, in order (a copy; the row read stays as it was)."""
    queue = iter(entries)
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        parts = []
        for part in content:
            is_placeholder = is_image_part(part) and not any(isinstance(part.get(k), str) and part[k] for k in IMAGE_KEYS)
            parts.append(next(queue) if is_placeholder else part)
        out.append({**m, "content": parts})
    return out


def table_rows(path: str) -> tuple[list[str], list[Any]]:
    """(column names, rows as dicts) of a parquet file. Raises ImageRowsError."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImageRowsError(f"{path}: reading parquet needs pyarrow", fix=INSTALL) from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
        raise ImageRowsError(f"{path}: cannot read it as parquet ({type(e).__name__}: {e})") from None
    return list(table.column_names), table.to_pylist()


def read_image_rows(path: str, messages_field: str) -> ImageRows:
    """Every row of a parquet file with its image placeholders filled from its images column. Raises ImageRowsError
    when rows hold placeholders but the file has no images column."""
    columns, rows = table_rows(path)
    column = next((c for c in IMAGES_COLUMNS if c in columns), None)
    if column is not None:
        _refuse_turns_without_roles(rows, messages_field, path)
    if column is None:
        needing = [i for i, r in enumerate(rows) if isinstance(r, Mapping) and _placeholders(r.get(messages_field))]
        if needing:
            raise ImageRowsError(
                f'{len(needing)} of {len(rows)} rows of {path} hold {{"type": "image"}} parts naming no file (rows '
                f"{', '.join(str(i) for i in needing[:5])}{', ...' if len(needing) > 5 else ''}), and the file has no "
                f"{' or '.join(repr(c) for c in IMAGES_COLUMNS)} column to take them from (its columns: {', '.join(map(repr, columns))})",
                fix='add an "images" column, a list of {"bytes": ..., "path": ...} structs (datasets\' Image feature) with one '
                'entry per {"type": "image"} part in order, or give each part its file as {"type": "image", "path": "images/x.png"}',
            )
        return ImageRows(rows)
    out: list[Any] = []
    mismatched = []
    for i, row in enumerate(rows):
        wanted = _placeholders(row.get(messages_field)) if isinstance(row, Mapping) else []
        images = _images_of(row.get(column) if isinstance(row, Mapping) else None, column, bool(wanted))
        if images and not wanted and (opened := _opened_with_images(row.get(messages_field), len(images))) is not None:
            row = {**row, messages_field: opened}
            wanted = _placeholders(opened)
        if not wanted and not images:
            out.append(row)
            continue
        if len(images) != len(wanted):  # an image without its part, too: the template would never place it
            mismatched.append(Mismatch(i, len(wanted), len(images)))
            out.append(row)
            continue
        entries = [_entry(image, f"{column}[{k}]" if column == "images" else column) for k, image in enumerate(images)]
        out.append({**row, messages_field: _fill(row[messages_field], entries)})
    return ImageRows(out, mismatched, column)


def _opened_with_images(messages: Any, n: int) -> list[Any] | None:
    """Messages of plain-text contents with `n` placeholders opening the first user turn whose content is text, as TRL
    places a row's images when its messages name none (trl 1.16 data_utils.py prepare_multimodal_messages); None when
    no user turn has text content."""
    if not isinstance(messages, list):
        return None
    for i, m in enumerate(messages):
        if isinstance(m, Mapping) and m.get("role") == "user" and isinstance(m.get("content"), str):
            parts = [*({"type": "image"} for _ in range(n)), {"type": "text", "text": m["content"]}]
            return [*messages[:i], {**m, "content": parts}, *messages[i + 1 :]]
    return None


def _refuse_turns_without_roles(rows: list[Any], messages_field: str, path: str) -> None:
    """Image rows whose chat is not {role, content} messages (HuggingFaceM4/the_cauldron's `texts` of
    {user, assistant, source} turns, which place no image part) are refused: where the images go is not written."""
    for i, row in enumerate(rows):
        turns = row.get(messages_field) if isinstance(row, Mapping) else None
        if not isinstance(turns, list) or not turns:
            continue
        first = turns[0]
        if isinstance(first, Mapping) and "role" not in first:
            raise ImageRowsError(
                f"data.messages_field = {messages_field!r}: row {i} of {path} holds its chat as "
                f"{{{', '.join(map(repr, first))}}} turns, not {{role, content}} messages whose content places each image "
                'with a {"type": "image"} part; gpuplan reads only the latter',
                fix='convert the rows first (datasets\' map): {"role": "user", "content": [{"type": "image"}, {"type": "text", '
                '"text": ...}]}, {"role": "assistant", "content": [{"type": "text", "text": ...}]}, one image part per entry '
                "of the images column; or set data.messages_field to the column that holds such messages",
            )
        return


def _images_of(value: Any, column: str, has_parts: bool) -> list[Any]:
    """A row's images column as a list: "images" is one already (null: none); "image" is one image, or none
    when it is null and the row has no part for it."""
    if column == "images":
        return value if isinstance(value, list) else []
    return [value] if value is not None or has_parts else []


def describe_mismatches(mismatched: list[Mismatch], total: int, path: str, shown: int = 5) -> str:
    """One sentence naming the rows whose placeholders and images differ in number, the first `shown` of them."""
    first = "; ".join(
        f"row {m.row}: {m.placeholders} image part{'s' if m.placeholders != 1 else ''}, {m.images} image{'s' if m.images != 1 else ''}"
        for m in mismatched[:shown]
    )
    return (
        f'{len(mismatched)} of {total} rows of {path} have a different number of {{"type": "image"}} parts than of images '
        f"({first}{'; ...' if len(mismatched) > shown else ''})"
    )


MISMATCH_FIX = 'give each row one entry in its "images" column per {"type": "image"} part, in the order of the parts, or remove those rows'
