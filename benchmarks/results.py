"""Write one benchmark's section of benchmarks/RESULTS.md, keeping the others."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = "# Benchmark results\n\nEach section is written by the script named in it; rerun the script to refresh it.\n"


def write_section(name: str, title: str, body: str, command: str | None = None) -> None:
    """`command`: the line that regenerates the section (default `python benchmarks/<name>.py`)."""
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n## {title}\n\n`{command or f'python benchmarks/{name}.py'}`\n\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)
