"""One formatter for a value as a TOML file writes it, for fixes, change lines, errors and init.

TOML 1.0 (toml.io/en/v1.0.0): booleans are `true`/`false`; basic strings use JSON's
escapes (\\" \\\\ \\n \\uXXXX), so json.dumps writes a valid one; floats as Python's repr,
with `inf`/`nan` spelled TOML's way; arrays `[a, b]`; inline tables `{ k = v }`.
TOML has no null: `none` stands in for None where the caller says what None means.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def toml_value(value: Any, *, none: str | None = None) -> str:
    if value is None:
        if none is None:
            raise ValueError("TOML has no null value")
        return none
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (an undecodable path): escape it rather than fail to print
            return json.dumps(value).replace("\x7f", "\\u007f")
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # DEL: TOML wants it escaped
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {toml_value(v, none=none)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v, none=none) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)
