"""A small TOML emitter for the fuzz tests.

tomllib only reads, and tomlkit refuses what the fuzzer must write: nan, inf,
integers past 64 bits, control characters in keys.
"""

from __future__ import annotations

import math
import re
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_str(s: str) -> str:
    out = ['"']
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def toml_key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else toml_str(k)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_doc(doc: dict[str, Any]) -> str:
    """A document: top-level scalars first, then one [table] per dict value."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"\n[{toml_key(k)}]")
            lines.extend(f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in v.items())
    return "\n".join(lines) + "\n"
