"""Images in chat rows checked before anything trains: every missing or undecodable image counted, none dropped.

A chat row's image parts (spec/chat_images.py) name files relative to the data file. The plan
reads every row of local .jsonl / .json files (as plan/checks/preference_rows.py does) and:
- refuses image parts when the model reads no images (its config.json has no vision tower):
  a text model's chat template would drop or garble them;
- counts the images that do not exist or that PIL cannot decode, with their first rows, as one
  error per kind (apply refuses the same images: apply/data/vision.py image_problems);
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
from gpuplan.spec.chat_images import decode, image_parts, pil_available

SHOWN_ROWS = 5
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


def read_rows(path: str) -> list[Any] | None:
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


def check_images(rows: list[Any], field_name: str, data_file: str, limit: ImageLimit | None) -> ImageReport:
    report = ImageReport()
    for i, row in enumerate(rows):
        parts = image_parts(row.get(field_name) if isinstance(row, Mapping) else None, data_file)
        if parts:
            report.rows_with_images += 1
        for part in parts:
            report.images += 1
            d = decode(part.path)
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
    values: Mapping[str, Any], *, vision_family: str | None, model_type: str | None, model_dir: str | None
) -> list[Diagnostic]:
    """Diagnostics for the image parts of a chat run's local data files (see the module docstring).

    `values` holds the spec's data.* keys (files resolved to paths) and training.objective;
    `vision_family` is the model's vision-language family (None: a text model)."""
    if (values.get("training.objective") or "sft") != "sft" or values.get("data.format") != "chat":
        return []
    field_name = values.get("data.messages_field") or "messages"
    limit = image_limit(model_dir, vision_family) if vision_family else None
    out: list[Diagnostic] = []
    for files_key in ("data.train_files", "data.eval_files"):
        for i, path in enumerate(values.get(files_key) or []):
            rows = read_rows(path) if os.path.isfile(path) else None
            if not rows:
                continue
            where = f"{files_key}[{i}]"
            if vision_family is None:
                with_images = [n for n, r in enumerate(rows) if isinstance(r, Mapping) and image_parts(r.get(field_name), path)]
                if with_images:
                    out.append(
                        Diagnostic(
                            "error",
                            where,
                            f"{where}: {len(with_images)} of {len(rows)} rows of {path} hold image parts (rows {_rows(with_images)}), "
                            f"but model {model_type or 'this model'} reads no images (its config.json has no vision tower)",
                            detail="a text model's chat template cannot place an image; its training would see none of them",
                            fix="use a vision-language model (Qwen2-VL, Idefics3 / SmolVLM, LLaVA, Gemma 3, mllama) in "
                            'model.name_or_path, or remove the {"type": "image"} parts from the rows',
                        )
                    )
                continue
            report = check_images(rows, field_name, path, limit)
            for problem, bad in report.problems.items():
                out.append(
                    Diagnostic(
                        "error",
                        where,
                        f"{where}: {len(bad)} of {report.images} images in {path}: {problem} (rows {_rows(bad)})",
                        detail="image paths are relative to the data file's directory; gpuplan drops no row silently",
                        fix="fix the paths or the files, or remove those rows",
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
