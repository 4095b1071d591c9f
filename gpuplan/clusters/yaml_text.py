"""Plain data (dicts, lists, strings, numbers, booleans, None) as block-style YAML text, without PyYAML.

The rendered Kubernetes manifests and SkyPilot task are read by the engines' YAML loaders (kubectl,
SkyPilot's `Task.from_yaml`, PyYAML's safe_load), so the text only needs the part of YAML 1.2 that
every YAML 1.1 loader reads the same way: every string is double-quoted with JSON's escapes (a subset
of YAML's double-quoted escapes, YAML 1.2 spec section 7.3.1), so "8", "yes" or "on" stay strings;
keys are written bare only when they cannot be read as anything else; a multi-line string (a script)
is a literal block scalar (section 8.1.2) when its lines allow one. tests/clusters/test_yaml_text.py
reads the text back with PyYAML and compares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
# words YAML 1.1 reads as booleans or null (yaml.org/type/bool.html, null.html): never bare
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def dump(data: Any) -> str:
    """`data` as YAML text ending in a newline."""
    return "\n".join(_lines(data, 0)) + "\n"


def dump_all(documents: Sequence[Any]) -> str:
    """Several documents in one stream, separated by `---` (kubectl apply -f reads them all)."""
    return "---\n".join(dump(d) for d in documents)


def _key(k: str) -> str:
    if _BARE_KEY.fullmatch(k) and k.lower() not in _RESERVED:
        return k
    return json.dumps(k)


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(f"yaml_text: cannot write {type(v).__name__} {v!r}")


def _block(v: str) -> bool:
    """A literal block keeps a script readable; only where every line reads back unchanged."""
    if "\n" not in v.rstrip("\n") or v.endswith("\n\n") or "\t" in v or "\r" in v:
        return False
    lines = v.rstrip("\n").split("\n")
    return bool(lines[0]) and not lines[0].startswith(" ") and all(line == line.rstrip() for line in lines)


def _lines(v: Any, indent: int) -> list[str]:
    """The value's lines at `indent` (used for a document or for a nested block)."""
    pad = " " * indent
    if isinstance(v, Mapping):
        if not v:
            return [pad + "{}"]
        out = []
        for k, item in v.items():
            out += _entry(pad + _key(str(k)) + ":", item, indent)
        return out
    if isinstance(v, (list, tuple)):
        if not v:
            return [pad + "[]"]
        out = []
        for item in v:
            if isinstance(item, Mapping) and item:
                inner = _lines(item, indent + 2)
                out.append(pad + "- " + inner[0][indent + 2 :])
                out += inner[1:]
            else:
                out += _entry(pad + "-", item, indent)
        return out
    return [pad + _scalar(v)]


def _entry(head: str, v: Any, indent: int) -> list[str]:
    """`head` ("key:" or "-") followed by the value: inline for scalars, nested below for blocks."""
    if isinstance(v, Mapping) and v:
        return [head, *_lines(v, indent + 2)]
    if isinstance(v, (list, tuple)) and v:
        return [head, *_lines(v, indent + 2)]
    if isinstance(v, str) and _block(v):
        chomp = "" if v.endswith("\n") else "-"
        pad = " " * (indent + 2)
        return [f"{head} |{chomp}", *(pad + line if line else "" for line in v.rstrip("\n").split("\n"))]
    if isinstance(v, Mapping):
        return [head + " {}"]
    if isinstance(v, (list, tuple)):
        return [head + " []"]
    return [head + " " + _scalar(v)]
