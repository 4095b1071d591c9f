"""The image parts of chat rows: where they are, the file each names, and whether it decodes.

A vision-language chat row writes a message's content as a list of parts, the layout of
transformers' multimodal chat templates (processing_utils.py ProcessorMixin.apply_chat_template):

    {"role": "user", "content": [{"type": "image", "path": "images/cat.png"}, {"type": "text", "text": "What is it?"}]}

An image part names its file by "path" (or "image" / "url" holding a local path, as
transformers accepts); a relative path is relative to the data file's directory, so a data
folder moves as a whole. Rows read from parquet (spec/parquet_images.py: the Hub image datasets'
layout) carry the image itself instead: their parts hold "bytes" (the encoded file) or a
"path" from the row's images column, and "column" names the entry they came from ("images[0]").
Both the plan (plan/checks/image_rows.py) and apply (apply/data/vision.py) read rows through
here, so they agree on which images a row has.

Decoding uses PIL (Pillow, the `vision` extra) when it is importable, without torch:
`Image.open` reads the header (format, size) and `verify()` checks the file's structure,
then a second open's `load()` decodes the pixels (PIL's docs: verify() leaves the image
unusable, so it is reopened). Without PIL only existence is checked.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

IMAGE_KEYS = ("path", "image", "url")  # where an image part names its file, in the order read
NULL_IMAGE = "is null"  # an images column entry that holds nothing (no struct at all)
EMPTY_IMAGE = 'has neither "bytes" nor "path"'  # an images column struct that names no image


@dataclass(frozen=True)
class ImagePart:
    message: int  # index of the message in the row
    source: str | None  # what the row wrote (None: an image part naming no file; "images[0]": an images column entry)
    path: str | None  # resolved against the data file's directory
    data: bytes | None = None  # the encoded image itself (an images column's "bytes")
    problem: str | None = None  # why the images column entry gives no image (NULL_IMAGE, EMPTY_IMAGE)


@dataclass(frozen=True)
class Decoded:
    """What opening an image file found: its size, or why it cannot be used."""

    width: int | None = None
    height: int | None = None
    problem: str | None = None  # "no such file", "cannot be decoded as an image (...)"


def is_image_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image"


def message_text(content: Any) -> str | None:
    """The text of a message's content: the string, or its text parts joined; None when it is neither."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        texts = [p.get("text") for p in content if p.get("type") == "text"]
        if all(isinstance(t, str) for t in texts):
            return "".join(t for t in texts if isinstance(t, str))
    return None


def image_parts(messages: Any, data_file: str) -> list[ImagePart]:
    """Every image part of a row's messages, its file resolved against `data_file`'s directory."""
    out: list[ImagePart] = []
    if not isinstance(messages, list):
        return out
    here = os.path.dirname(os.path.abspath(data_file))
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not is_image_part(part):
                continue
            source = next((part[k] for k in IMAGE_KEYS if isinstance(part.get(k), str) and part[k]), None)
            path = None if source is None else os.path.normpath(os.path.join(here, os.path.expanduser(source)))
            column = part.get("column")
            if not isinstance(column, str):
                out.append(ImagePart(i, source, path))
                continue
            data = part.get("bytes")
            data = bytes(data) if isinstance(data, (bytes, bytearray)) and data else None
            problem = NULL_IMAGE if part.get("null") else EMPTY_IMAGE if data is None and path is None else None
            out.append(ImagePart(i, column, None if data is not None else path, data, problem))
    return out


def has_image_parts(rows: list[Any], field: str) -> bool:
    return any(isinstance(r, Mapping) and image_parts(r.get(field), ".") for r in rows)


def pil_available() -> bool:
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def decode(image: str | bytes | None) -> Decoded:
    """Open the image (a file's path, or the encoded file's bytes) as apply will (PIL), or say why it cannot be."""
    if image is None:
        return Decoded(problem='names no file (give it "path": "images/x.png")')
    if isinstance(image, str) and not os.path.isfile(image):
        return Decoded(problem="no such file" if not os.path.isdir(image) else "a directory, not an image file")
    if not pil_available():
        return Decoded()
    from PIL import Image, UnidentifiedImageError

    def source() -> Any:
        return io.BytesIO(image) if isinstance(image, bytes) else image

    try:
        with Image.open(source()) as im:
            im.verify()
        with Image.open(source()) as im:
            im.load()
            return Decoded(width=im.width, height=im.height)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:  # PIL raises SyntaxError for some broken files
        return Decoded(problem=f"cannot be decoded as an image ({type(e).__name__}: {e})")


def decode_part(part: ImagePart) -> Decoded:
    """decode() of an image part: its bytes, else its file; an images column entry that names no image says so."""
    if part.problem is not None:
        return Decoded(problem=part.problem)
    return decode(part.data if part.data is not None else part.path)
