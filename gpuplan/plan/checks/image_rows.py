"""Images in chat rows checked before anything trains: every missing or undecodable image counted, none dropped.

A chat row's image parts (spec/chat_images.py) name files relative to the data file, or carry the
image's bytes from an images column (parquet, the Hub image datasets' layout: spec/parquet_images.py).
The plan reads every row of local .jsonl / .json / .parquet files, and of a Hub dataset's files of
data.split when they are in the cache (plan/build.py finds them; planning downloads none), as
plan/checks/preference_rows.py does, and:
- refuses image parts when the model reads no images (its config.json has no vision tower):
  a text model's chat template would drop or garble them;
- counts the images that do not exist, that an images column leaves null or empty, or that PIL
  cannot decode, with their first rows, as one error per kind (apply refuses the same images:
  apply/data/vision.py image_problems);
- refuses parquet rows whose image placeholders and images differ in number, and placeholders in a
  file without an images column;
- says how many images are larger than the processor's limit, which resizes them (a note: the
  plan's image tokens are those of the resized image). The limit is the processor's
  configuration: Idefics3 / SmolVLM `size.longest_edge` (px, the longest side; image_processing_idefics3.py
  resizes to it), Qwen2-VL / Qwen2.5-VL `max_pixels` or `size.longest_edge` (a pixel count:
  image_processing_qwen2_vl.py smart_resize scales an image above it down to it).
Decoding needs Pillow (the `vision` extra); without it only existence is checked, and the plan says so.
Stdlib + PIL, no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplan.plan.types import Diagnostic
from gpuplan.spec.chat_images import decode_part, image_parts, pil_available
from gpuplan.spec.parquet_images import MISMATCH_FIX, ImageRows, ImageRowsError, describe_mismatches, is_parquet, read_image_rows

SHOWN_ROWS = 5
PATH_DETAIL = "image paths are relative to the data file's directory; gpuplan drops no row silently"
PATH_FIX = "fix the paths or the files, or remove those rows"
COLUMN_DETAIL = (
    'an images column holds one {"bytes": ..., "path": ...} struct per image part (datasets\' Image feature), '
    "a path relative to the data file's directory; gpuplan drops no row silently"
)
COLUMN_FIX = "give those entries the image's encoded bytes (or a path to its file), or remove those rows"
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class ImageLimit:
    """The largest image the processor takes without resizing: a longest side in px, or a pixel count."""

    longest_edge: int | None = None
    max_pixels: int | None = None

    def exceeded_by(self, width: int, height: int) -> bool:
        if self.longest_edge is not None and max(width, height) > self.longest_edge:
            return True
        return self.max_pixels is not None and width * height > self.max_pixels

    def describe(self) -> str:
        if self.longest_edge is not None:
            return f"a longest side of {self.longest_edge} px"
        return f"{self.max_pixels:,} pixels"


def image_limit(model_dir: str | None, family: str | None) -> ImageLimit | None:
    """The processor's resize limit from the model directory's processor files, or None when it has none."""
    if not model_dir or not os.path.isdir(model_dir):
        return None
    for name in PROCESSOR_FILES:
        path = os.path.join(model_dir, name)
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError):
            continue
        inner = d.get("image_processor", d) if isinstance(d, Mapping) else {}  # processor_config.json nests it
        d = inner if isinstance(inner, Mapping) else {}
        size = d["size"] if isinstance(d.get("size"), Mapping) else {}
        if family in ("qwen2_vl", "qwen2_5_vl"):
            pixels = d.get("max_pixels") or size.get("longest_edge")
            return ImageLimit(max_pixels=int(pixels)) if isinstance(pixels, int) else None
        edge = size.get("longest_edge")
        if isinstance(edge, int):
            return ImageLimit(longest_edge=edge)
    return None


@dataclass
class ImageReport:
    rows_with_images: int = 0
    images: int = 0
    problems: dict[str, list[int]] = field(default_factory=dict)  # problem -> rows (0-based), one per image
    resized: int = 0
    largest: tuple[int, int] | None = None  # (width, height) of the largest image read

    def add(self, problem: str, row: int) -> None:
        self.problems.setdefault(problem, []).append(row)


def read_rows(path: str, messages_field: str = "messages") -> ImageRows | None:
    """The rows of a data file (parquet: with their placeholders filled, spec/parquet_images.py); None when it is
    no JSON or parquet file or cannot be read as one (data_fields.py or apply says so). Raises ImageRowsError."""
    if is_parquet(path):
        return read_image_rows(path, messages_field)
    rows = _json_rows(path)
    return None if rows is None else ImageRows(rows)


def _json_rows(path: str) -> list[Any] | None:
    suffix = os.path.splitext(path)[1].lower()
    try:
        with open(path, encoding="utf-8") as f:
            if suffix == ".jsonl":
                return [json.loads(line) for line in f if line.strip()]
            if suffix == ".json":
                data = json.load(f)
                return data if isinstance(data, list) else None
    except (OSError, ValueError):
        return None  # unreadable: data_fields.py or apply says so
    return None


def check_images(rows: list[Any], field_name: str, data_file: str, limit: ImageLimit | None, skip: set[int] | None = None) -> ImageReport:
    report = ImageReport()
    for i, row in enumerate(rows):
        if skip and i in skip:
            continue
        parts = image_parts(row.get(field_name) if isinstance(row, Mapping) else None, data_file)
        if parts:
            report.rows_with_images += 1
        for part in parts:
            report.images += 1
            d = decode_part(part)
            if d.problem is not None:
                report.add(d.problem.split(" (")[0], i)
                continue
            if d.width is None or d.height is None:
                continue
            if report.largest is None or d.width * d.height > report.largest[0] * report.largest[1]:
                report.largest = (d.width, d.height)
            if limit is not None and limit.exceeded_by(d.width, d.height):
                report.resized += 1
    return report


def _rows(rows: list[int]) -> str:
    return ", ".join(str(r) for r in rows[:SHOWN_ROWS]) + (", ..." if len(rows) > SHOWN_ROWS else "")


def image_row_problems(
    values: Mapping[str, Any],
    *,
    vision_family: str | None,
    model_type: str | None,
    model_dir: str | None,
    dataset_files: list[str] | None = None,
) -> list[Diagnostic]:
    """Diagnostics for the image parts of a chat run's data files (see the module docstring).

    `values` holds the spec's data.* keys (files resolved to paths) and training.objective;
    `vision_family` is the model's vision-language family (None: a text model); `dataset_files`
    are the cached files of data.dataset's split (None: no Hub dataset, or its files are not cached)."""
    if (values.get("training.objective") or "sft") != "sft" or values.get("data.format") != "chat":
        return []
    field_name = values.get("data.messages_field") or "messages"
    limit = image_limit(model_dir, vision_family) if vision_family else None
    sources = [(f"{k}[{i}]", p) for k in ("data.train_files", "data.eval_files") for i, p in enumerate(values.get(k) or [])]
    sources += [("data.dataset", p) for p in dataset_files or []]
    out: list[Diagnostic] = []
    for where, path in sources:
        try:
            table = read_rows(path, field_name) if os.path.isfile(path) else None
        except ImageRowsError as e:
            out.append(Diagnostic("error", where, f"{where}: {e.summary}", fix=e.fix))
            continue
        if table is None or not table.rows:
            continue
        out += _mismatches(where, path, table)
        if vision_family is None:
            out += _text_model_images(where, path, table.rows, field_name, model_type)
        else:
            skip = {m.row for m in table.mismatched}  # refused above: their placeholders hold no image to open
            out += _image_problems(where, path, check_images(table.rows, field_name, path, limit, skip), limit)
    return out


def _mismatches(where: str, path: str, table: ImageRows) -> list[Diagnostic]:
    if not table.mismatched:
        return []
    return [
        Diagnostic(
            "error",
            where,
            f"{where}: {describe_mismatches(table.mismatched, len(table.rows), path, SHOWN_ROWS)}",
            detail=f"each image part naming no file takes the next entry of the row's {table.images_column!r} column; "
            "gpuplan does not guess which image goes where",
            fix=MISMATCH_FIX,
        )
    ]


def _text_model_images(where: str, path: str, rows: list[Any], field_name: str, model_type: str | None) -> list[Diagnostic]:
    with_images = [n for n, r in enumerate(rows) if isinstance(r, Mapping) and image_parts(r.get(field_name), path)]
    if not with_images:
        return []
    return [
        Diagnostic(
            "error",
            where,
            f"{where}: {len(with_images)} of {len(rows)} rows of {path} hold image parts (rows {_rows(with_images)}), "
            f"but model {model_type or 'this model'} reads no images (its config.json has no vision tower)",
            detail="a text model's chat template cannot place an image; its training would see none of them",
            fix="use a vision-language model (Qwen2-VL, Idefics3 / SmolVLM, LLaVA, Gemma 3, mllama) in "
            'model.name_or_path, or remove the {"type": "image"} parts from the rows',
        )
    ]


def _image_problems(where: str, path: str, report: ImageReport, limit: ImageLimit | None) -> list[Diagnostic]:
    out = []
    detail, fix = (COLUMN_DETAIL, COLUMN_FIX) if is_parquet(path) else (PATH_DETAIL, PATH_FIX)
    for problem, bad in report.problems.items():
        out.append(
            Diagnostic(
                "error",
                where,
                f"{where}: {len(bad)} of {report.images} images in {path}: {problem} (rows {_rows(bad)})",
                detail=detail,
                fix=fix,
            )
        )
    if report.resized and limit is not None:
        largest = f"; the largest is {report.largest[0]} x {report.largest[1]} px" if report.largest else ""
        out.append(
            Diagnostic(
                "note",
                where,
                f"{where}: {report.resized} of {report.images} images in {path} are larger than the processor's "
                f"limit ({limit.describe()}) and are resized to it{largest}",
                detail="the processor resizes them before the vision tower; their image tokens are those of the resized image",
            )
        )
    if report.images and not pil_available():
        out.append(
            Diagnostic(
                "note",
                where,
                f"{where}: the {report.images} images of {path} exist; whether they decode is checked by apply",
                fix="pip install 'gpuplan[vision]' (Pillow) to check them at plan time",
            )
        )
    return out
