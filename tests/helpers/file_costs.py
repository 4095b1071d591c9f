"""Longest files first: the order tests/conftest.py gives the collected tests, and the table it reads.

`pytest -n 2 --dist loadfile` hands whole files to the workers in collection order, so one long file
collected last keeps one worker busy while the other has nothing left (a long tail). Sorting the files
by what they cost, longest first, lets the short ones fill in at the end. The order of the tests within
a file is left as collected, and each file's tests stay together.

The costs are seconds per test file (setup, call and teardown of its tests added up) in
tests/file_costs.json. A file the table does not name costs UNKNOWN_SLOW seconds per test marked slow
(and nothing for the others), so a new slow file still goes early.

Refresh the table from a full run (it records what each file took and merges it into the table):
    python -m pytest -q -n 2 --dist loadfile -p no:cacheprovider --record-file-costs tests/file_costs.json
or from the output of a run with `--durations=0` (or `--durations=N`: only those lines count):
    python -m tests.helpers.file_costs DURATIONS.txt [...]
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "file_costs.json"
UNKNOWN_SLOW = 20.0  # seconds per slow-marked test of a file the table does not name


def load(path: Path = TABLE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["seconds"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def order(items: list, costs: dict[str, float]) -> None:
    """Sort `items` (pytest items, in place) by their file's cost, longest first; stable, so the tests
    of a file keep their order and ties keep the collection order."""
    estimate: dict[str, float] = defaultdict(float)
    for item in items:
        f = _file(item.nodeid)
        if f not in costs and item.get_closest_marker("slow") is not None:
            estimate[f] += UNKNOWN_SLOW
    first = {}
    for i, item in enumerate(items):
        first.setdefault(_file(item.nodeid), i)
    items.sort(key=lambda it: (-costs.get(_file(it.nodeid), estimate[_file(it.nodeid)]), first[_file(it.nodeid)]))


def save(seconds: dict[str, float], path: Path = TABLE) -> None:
    """Merge `seconds` into the table at `path` (files not measured keep their old cost)."""
    table = load(path)
    table.update({f: round(s, 1) for f, s in seconds.items()})
    body = {
        "about": "seconds per test file, for the longest-first order of tests/conftest.py; refresh: see tests/helpers/file_costs.py",
        "seconds": dict(sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
    path.write_text(json.dumps(body, indent=1) + "\n")


class Recorder:
    """The --record-file-costs plugin: adds up each file's test durations as the reports come in (on
    the xdist controller too) and merges them into the table at the end of the session."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller records
            return
        if self.seconds:
            save(dict(self.seconds), self.path)


DURATION = re.compile(r"^\s*([\d.]+)s\s+(?:setup|call|teardown)\s+(\S+?)::")


def from_durations(lines: list[str]) -> dict[str, float]:
    """Per-file seconds from the lines of pytest's `--durations` report."""
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        m = DURATION.match(line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    return dict(seconds)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    seconds: dict[str, float] = defaultdict(float)
    for name in argv:
        for f, s in from_durations(Path(name).read_text().splitlines()).items():
            seconds[f] += s
    save(dict(seconds))
    print(f"{TABLE}: {len(seconds)} files from {', '.join(argv)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
