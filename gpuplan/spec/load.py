"""TOML file -> dict, with errors that carry file:line:col.

Hostile input (a directory, binary garbage, a huge file) ends in a SpecLoadError,
never a traceback.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from gpuplan.errors import Diagnostic, GpuplanError

# A spec is a few KB (the largest in specs/ is 1.3 KB); refuse anything absurd before parsing: tomllib
# reads about 1 MiB of keys or list items per second on one core, so the cap bounds the parse at a second.
MAX_SPEC_BYTES = 1024 * 1024

_POS = re.compile(r"\(at line (\d+), column (\d+)\)")
_EOD = "(at end of document)"


@dataclass(frozen=True)
class LoadedSpec:
    path: Path  # absolute
    raw: dict[str, Any]
    sha256: str


def table(raw: Mapping[str, Any], section: str) -> dict[str, Any]:
    """The [section] table of a spec dict, or {} when it is absent or not a table."""
    value = raw.get(section)
    return dict(value) if isinstance(value, dict) else {}


def _fail(path: Path, summary: str, fix: str | None = None, pos: str = "") -> GpuplanError:
    """One error located at `path` (and `pos` = "line:col" when known)."""
    where = f"{path}:{pos}" if pos else str(path)
    return GpuplanError([Diagnostic("error", None, f"{where}: {summary}", fix=fix)])


def load_toml(path: str | Path) -> LoadedSpec:
    """Read and parse a spec file. Raises GpuplanError with one diagnostic."""
    p = Path(path).expanduser()
    try:
        p = p.resolve()
        exists, is_dir = p.exists(), p.is_dir()  # these re-raise ENAMETOOLONG, EACCES ...
    except OSError as e:
        raise _fail(p, f"cannot resolve path: {e.strerror or e}") from None
    if not exists:
        raise _fail(p, "no such file", fix="check the path; specs are TOML files such as specs/tiny.toml")
    if is_dir:
        raise _fail(p, "is a directory, not a spec file", fix="give the path of a .toml file")
    try:
        size = p.stat().st_size
        if size > MAX_SPEC_BYTES:
            limit = f"a spec is at most {MAX_SPEC_BYTES} bytes (1 MiB)"
            raise _fail(p, f"is {size} bytes; {limit}", fix="give the path of a spec file (TOML, a few KB)")
        data = p.read_bytes()
    except OSError as e:
        raise _fail(p, f"cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(p, f"not UTF-8 text (byte 0x{data[e.start]:02x}); a spec is a TOML file", pos=f"{line}:{col}") from None
    return LoadedSpec(path=p, raw=parse_toml_text(text, p), sha256=hashlib.sha256(data).hexdigest())


def parse_toml_text(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _POS.search(msg)
        if m:
            pos = f"{m.group(1)}:{m.group(2)}"
        else:  # tomllib says "(at end of document)": give the end's line:col, as for any other error
            pos = f"{text.count(chr(10)) + 1}:{len(text) - text.rfind(chr(10))}"
        reason = _POS.sub("", msg).replace(_EOD, "at the end of the file").strip()
        raise _fail(path, f"invalid TOML: {reason}", pos=pos) from None
    except RecursionError:
        raise _fail(path, "invalid TOML: nesting too deep") from None
