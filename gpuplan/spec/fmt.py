"""`gpuplan fmt`: a spec's layout in schema order, comments kept, data unchanged.

What moves where:
- sections in schema order (model, hardware, data, training, distributed, output),
  unknown sections after them in their original order;
- keys inside a known section in schema field order, unknown keys after them;
- comment lines directly above a key move with that key; an inline comment stays on
  its line; comment lines directly above a [section] header (no blank line between)
  move with that section; comments after a section's last key stay at its end;
- the comment lines at the top of the file, up to the first blank line, stay on top;
- `key = value` with one space around "=", no indentation, one blank line between
  sections, at most one blank line inside a section.

fmt does not validate. Anything it cannot reorder safely (sub-tables, dotted keys,
arrays of tables) is kept exactly as tomlkit wrote it, after the simple sections.
The result is checked to parse to the same data as the input before it is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from tomlkit import items as tk_items
from tomlkit.exceptions import ParseError as TomlkitParseError

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.spec.load import load_toml, parse_toml_text
from gpuplan.spec.schema import SECTIONS

_BLANK = ("blank", "")  # one blank line


@dataclass
class _Block:
    """A key line and the comment (and blank) lines directly above it."""

    name: str
    prefix: list[tuple[str, str]]  # ("comment", text) | _BLANK
    line: str  # `key = value  # comment`, without the final newline


@dataclass
class _Entry:
    """One top-level table: the comment lines above its header and its text."""

    name: str
    leading: list[str] = field(default_factory=list)
    text: str = ""  # header + body, ends with a newline
    trailing: list[tuple[str, str]] = field(default_factory=list)  # the body's tail after its last key


def format_spec_text(text: str, *, source: str | Path = "<text>") -> str:
    """The spec `text` laid out in schema order; see the module docstring.

    Raises GpuplanError (file:line:col) for invalid TOML. `source` names the file in errors.
    """
    before = parse_toml_text(text, Path(source))  # invalid TOML: GpuplanError with line:col
    try:
        doc = tomlkit.parse(text)
    except TomlkitParseError as e:  # tomllib accepted it; tomlkit did not
        raise GpuplanError([Diagnostic("error", None, f"{source}:{e.line}:{e.col}: invalid TOML: {e}")]) from None
    out = _render(doc)
    if parse_toml_text(out, Path(source)) != before:  # a bug here must never change a spec's meaning
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    None,
                    f"{source}: gpuplan fmt cannot reformat this file without changing its data; left unchanged",
                    fix="please report this as a bug",
                )
            ]
        )
    return out


def read_spec_text(path: str | Path) -> str:
    """A spec file's text, exactly as stored; GpuplanError (file:line:col) when it is not a readable TOML file."""
    loaded = load_toml(path)  # the same refusals as `plan`: missing, directory, huge, not UTF-8, bad TOML
    return loaded.path.read_bytes().decode("utf-8")


def _render(doc: tomlkit.TOMLDocument) -> str:
    top: list[tuple[str, str]] = []  # lines before the first table: comments, blanks, plain keys
    entries: list[_Entry] = []
    head_touches: _Entry | None = None  # the first table, when the file's header sits right on it
    for key, item in doc.body:
        if _is_header_table(key, item):
            entry = _entry(key, item)
            if not entries and top and top[-1][0] == "comment":
                head_touches = entry
            above = top if not entries else entries[-1].trailing
            entry.leading = _take_adjacent_comments(above, is_file_top=not entries)
            entries.append(entry)
        elif entries:  # tomlkit keeps everything after a header inside that table
            entries[-1].text += _verbatim(key, item)
        else:
            top.extend(_lines(key, item))
    order = {name: i for i, name in enumerate(SECTIONS)}
    entries.sort(key=lambda e: order.get(e.name, len(order)))  # stable: unknown sections keep their order
    parts: list[str] = []
    head = _join(_strip_blanks(_squeeze(top), leading=True))
    if head:
        parts.append(head)
    for e in entries:
        tail = _join(_strip_blanks(_squeeze(e.trailing)))  # a blank line before it is kept
        parts.append("".join(f"{c}\n" for c in e.leading) + e.text + tail)
    if head and entries and entries[0] is head_touches and not entries[0].leading:
        parts[:2] = [parts[0] + parts[1]]  # a header written right above the first table stays there
    return "\n".join(parts)


def _is_header_table(key: Any, item: Any) -> bool:
    """A `[table]` or `[[array]]` at the top level (not a dotted `a.b = 1` key)."""
    return isinstance(item, (tk_items.Table, tk_items.AoT)) and not (key is not None and key.is_dotted())


def _entry(key: Any, item: Any) -> _Entry:
    name = key.key
    schema = SECTIONS.get(name)
    if not isinstance(item, tk_items.Table) or item.is_super_table() or _has_children(item):
        return _verbatim_entry(name, _verbatim(key, item))
    header = f"[{key.as_string().strip()}]" + _inline_comment(item.trivia)
    blocks, trailing = _blocks(item)
    if schema is not None:
        fields = {f: i for i, f in enumerate(schema.model_fields)}
        blocks.sort(key=lambda b: fields.get(b.name, len(fields)))  # stable: unknown keys keep their order
    lines = [header]
    for i, b in enumerate(blocks):
        prefix = _squeeze(b.prefix)
        if i == 0:
            while prefix and prefix[0] == _BLANK:
                prefix.pop(0)
        lines += [text for _, text in prefix] + [b.line]
    return _Entry(name, text="\n".join(lines) + "\n", trailing=trailing)


def _verbatim_entry(name: str, text: str) -> _Entry:
    """A table kept as tomlkit writes it, its closing comment and blank lines split off as its tail.

    Only whole lines at the very end are split off: a multi-line string or array ends in
    its closing delimiter, so a `#` line found there is a comment.
    """
    lines = text.splitlines()
    tail: list[tuple[str, str]] = []
    while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("#")):
        ln = lines.pop().strip()
        tail.insert(0, ("comment", ln) if ln else _BLANK)
    return _Entry(name, text="\n".join(lines) + "\n", trailing=tail)


def _has_children(table: tk_items.Table) -> bool:
    return any(isinstance(v, (tk_items.Table, tk_items.AoT)) for _, v in table.value.body)


def _blocks(table: tk_items.Table) -> tuple[list[_Block], list[tuple[str, str]]]:
    blocks: list[_Block] = []
    pending: list[tuple[str, str]] = []
    for key, item in table.value.body:
        if key is None:
            pending.extend(_lines(key, item))
        else:
            blocks.append(_Block(key.key, pending, _kv(key, item)))
            pending = []
    return blocks, pending


def _lines(key: Any, item: Any) -> list[tuple[str, str]]:
    """Comment, blank and `key = value` lines of one body item."""
    if isinstance(item, tk_items.Whitespace):
        return [_BLANK] * item.as_string().count("\n")
    if isinstance(item, tk_items.Comment):
        return [("comment", item.trivia.comment.strip())]
    if key is None:  # pragma: no cover - tomlkit puts only whitespace and comments keyless
        return [("comment", item.as_string().strip())]
    return [("key", _kv(key, item))]


def _kv(key: Any, item: Any) -> str:
    if isinstance(item, (tk_items.Table, tk_items.AoT)):  # a dotted key (a.b = 1): tomlkit writes it
        return _verbatim(key, item).rstrip("\r\n")
    return f"{key.as_string().strip()} = {item.as_string()}{_inline_comment(item.trivia)}"


def _inline_comment(trivia: Any) -> str:
    if not trivia.comment:
        return ""
    return (trivia.comment_ws or "  ") + trivia.comment.strip()


def _verbatim(key: Any, item: Any) -> str:
    """One top-level item as tomlkit writes it (tables with their headers and sub-tables)."""
    doc = tomlkit.document()
    doc.body.append((key, item))
    return doc.as_string()


def _take_adjacent_comments(lines: list[tuple[str, str]], *, is_file_top: bool) -> list[str]:
    """Remove and return the comment lines at the end of `lines` with no blank line after them.

    At the top of the file a comment group that starts on line 1 is the file's header and stays.
    """
    n = 0
    while n < len(lines) and lines[len(lines) - 1 - n][0] == "comment":
        n += 1
    if n == 0 or (is_file_top and all(ln == _BLANK for ln in lines[: len(lines) - n])):
        return []
    taken = [text for _, text in lines[len(lines) - n :]]
    del lines[len(lines) - n :]
    return taken


def _squeeze(lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Runs of blank lines become one."""
    out: list[tuple[str, str]] = []
    for ln in lines:
        if not (ln == _BLANK and out and out[-1] == _BLANK):
            out.append(ln)
    return out


def _strip_blanks(lines: list[tuple[str, str]], *, leading: bool = False) -> list[tuple[str, str]]:
    """Blank lines at the end (and at the start, with `leading`) removed."""
    lines = list(lines)
    while lines and lines[-1] == _BLANK:
        lines.pop()
    while leading and lines and lines[0] == _BLANK:
        lines.pop(0)
    return lines


def _join(lines: list[tuple[str, str]]) -> str:
    return "".join(f"{text}\n" for _, text in lines)
