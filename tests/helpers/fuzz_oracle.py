"""The fuzz oracle: plan a spec file and assert the rejection or the plan is well-formed.

Used by tests/plan/test_fuzz_specs.py (generated specs) and tests/plan/test_fuzz_found.py
(what the fuzzer found). See the former's docstring for the properties.
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import tomllib
from hypothesis import event
from hypothesis.control import currently_in_test_context

from gpuplan.plan.build import plan_file
from gpuplan.plan.types import Plan, PlanError
from gpuplan.render.style import Style
from gpuplan.render.text import render_plan
from gpuplan.spec.schema import SECTIONS
from tests.helpers.planning import ENV

RAN: collections.Counter = collections.Counter()  # examples run and their outcome, per test


def check(name: str, path: Path, *, strict: bool = False, env=ENV, overrides=None) -> str:
    """Plan `path`; assert the rejection or the plan is well-formed. Returns "accepted" or "rejected"."""
    RAN[name] += 1
    try:
        plan = plan_file(path, environment=env, strict=strict, overrides=overrides)
    except PlanError as e:
        check_rejection(path, e)
        _event("rejected: " + (e.diagnostics[0].key or "file")[:40])
        RAN[name + ":rejected"] += 1
        return "rejected"
    check_plan(path, plan)
    _event("accepted")
    RAN[name + ":accepted"] += 1
    return "accepted"


def _event(text: str) -> None:
    if currently_in_test_context():  # hypothesis statistics (pytest --hypothesis-show-statistics)
        event(text)


def _top_keys(path: Path) -> set[str]:
    try:
        return set(SECTIONS) | set(tomllib.loads(path.read_text("utf-8")))
    except Exception:
        return set(SECTIONS)


def _key_root(key: str) -> str | None:
    """The first key of a key path written as TOML (training.optim, "my key".x, data.f[0])."""
    expr = re.sub(r"(\[\d+\])+$", "", key)
    try:
        return next(iter(tomllib.loads(f"{expr} = 0")))
    except (tomllib.TOMLDecodeError, StopIteration):
        return None


def check_rejection(path: Path, e: PlanError) -> None:
    errors = [d for d in e.diagnostics if d.severity == "error"]
    assert errors, f"PlanError without an error: {e.diagnostics}"
    where = str(path.resolve())
    roots = _top_keys(path)
    for d in e.diagnostics:
        assert d.severity in ("error", "warning", "note") and isinstance(d.summary, str) and d.summary.strip(), d
    for d in errors:
        if d.key:
            assert _key_root(d.key) in roots, f"error key {d.key!r} is not a key path of the spec: {d}"
        else:
            assert d.summary.startswith(where + ":"), f"error names neither a key nor the file: {d}"
            if "invalid TOML" in d.summary and "nesting too deep" not in d.summary:
                pos = d.summary[len(where) + 1 :].split(":")
                assert pos[0].isdigit() and pos[1].isdigit(), f"TOML error without line:col: {d.summary}"


def check_plan(path: Path, plan: Plan) -> None:
    v = plan.value
    b, a = v("training.per_device_train_batch_size"), v("training.gradient_accumulation_steps")
    count, nodes = v("hardware.count"), v("hardware.nodes")
    assert all(type(x) is int and x >= 1 for x in (b, a, count, nodes)), (b, a, count, nodes)
    assert v("training.effective_batch_size") == b * a * count * nodes
    mem = plan.memory
    assert mem.fits is True, "an accepted plan must fit"
    headroom = v("hardware.headroom")
    assert mem.capacity_bytes == plan.hardware.memory_bytes
    assert mem.usable_bytes == int(mem.capacity_bytes * (1 - headroom))
    assert 0 < mem.allocated_peak_bytes <= mem.reserved_peak_bytes <= mem.usable_bytes
    assert all(x is None or (isinstance(x, int) and x >= 0) for x in mem.components.values()), mem.components
    for key, s in plan.settings.items():
        assert s.source in ("user", "default", "derived", "adjusted"), (key, s)
        if s.source in ("derived", "adjusted"):
            assert s.reason and s.rule, (key, s)
            assert any(c.key == key for c in plan.changes), f"{key} is {s.source} without a Change"
    seen = set()
    for c in plan.changes:
        assert c.action in ("add", "change") and c.rule and c.reason and c.reason.strip(), c
        assert c.key not in seen, f"{c.key} changed twice"
        seen.add(c.key)
        assert plan.settings[c.key].value == c.after, c
    raw = tomllib.loads(path.read_text("utf-8"))
    for key in ("training.effective_batch_size", "data.seq_len", "training.learning_rate", "model.dtype"):
        section, name = key.split(".")
        if name in raw.get(section, {}):
            assert v(key) == raw[section][name], f"{key} is the user's and must be kept"
    data = plan.to_dict()
    text = json.dumps(data, allow_nan=False, default=str)  # NaN/inf in a plan is a bug
    assert json.dumps(Plan.from_dict(json.loads(text)).to_dict(), default=str) == text
    assert render_plan(data, Style(False)).strip()


def write(work: Path, text: str | bytes, name: str = "spec.toml") -> Path:
    p = work / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    return p
