"""The plan-to-apply seam is typed (issue 29): apply/ and after/ read `plan.resolved.<section>.<key>`,
never a string path, and a plan with a missing, unknown or wrongly-typed key is refused when it is
assembled or loaded, naming the key.

A string-path read is, in the AST: `<x>.value(...)` / `<x>.get(...)` on a plan (`plan`, `run.plan`,
`self.plan`) or with a "section.key" literal, `<x>.settings[...]`, `<x>.settings.get(...)`, `... in
<x>.settings`, or a "section.key" literal subscript (`settings["output.dir"]`).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from gpuplan.errors import GpuplanError
from gpuplan.plan.types import Plan

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gpuplan"
SECTIONS = ("model", "lora", "quantization", "hardware", "data", "training", "preference", "distributed", "output", "eval")


def _is_key(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    section, dot, name = node.value.partition(".")
    return bool(dot) and section in SECTIONS and name.isidentifier()


def _is_plan(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "plan") or (isinstance(node, ast.Attribute) and node.attr == "plan")


def _is_settings(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "settings"


def string_reads(source: str) -> list[int]:
    """The lines of every string-path read of a plan's settings in `source`."""
    lines = []
    tree = ast.parse(source)
    called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("value", "get") and (_is_plan(node.value) or _is_settings(node.value)):
            call = called.get(id(node))
            first = call.args[0] if call is not None and call.args else None
            # a plan's JSON dict read by a plain word (plan.get("memory", {})) is not a settings read
            if first is None or not isinstance(first, ast.Constant) or _is_key(first):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("value", "get"):
            if node.args and _is_key(node.args[0]) and not (_is_plan(node.func.value) or _is_settings(node.func.value)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and (_is_settings(node.value) or _is_key(node.slice)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            if any(_is_settings(c) for c in node.comparators):
                lines.append(node.lineno)
    return sorted(lines)


def reads_in(package: Path) -> dict[str, list[int]]:
    out = {}
    for path in sorted(package.rglob("*.py")):
        found = string_reads(path.read_text())
        if found:
            out[str(path.relative_to(ROOT))] = found
    return out


@pytest.mark.parametrize("package", ["apply", "after"])
def test_apply_and_after_read_typed_settings_only(package):
    found = reads_in(PKG / package)
    assert not found, f"string-path reads of plan settings (use plan.resolved.<section>.<key>): {found}"


def test_the_counter_sees_every_form_of_a_string_read():
    source = """
a = plan.value("training.seed")
b = run.plan.get("model.method")
c = self.plan.settings["output.dir"]
d = settings["output.dir"].value
e = "data.format" in plan.settings
f = values.get("model.task")
v = plan.value
ok = plan.resolved.training.seed
ok2 = {"a": 1}.get("a")
ok3 = plan.get("memory", {})
w = plan.get(key)
"""
    assert string_reads(source) == [2, 3, 4, 5, 6, 7, 8, 12]


def _plan_json() -> dict:
    from gpuplan.plan.build import plan_file
    from tests.helpers.planning import ENV

    plan = plan_file(ROOT / "specs" / "tiny.toml", environment=ENV)
    return json.loads(json.dumps(plan.to_dict()))


@pytest.fixture(scope="module")
def plan_dict() -> dict:
    return _plan_json()


def test_a_loaded_plan_has_the_typed_settings(plan_dict):
    plan = Plan.from_dict(plan_dict)
    assert plan.resolved.training.seed == plan_dict["settings"]["training.seed"]["value"]
    assert isinstance(plan.resolved.training.learning_rate, float)
    assert plan.resolved.data.train_files == tuple(plan_dict["settings"]["data.train_files"]["value"])
    assert plan.resolved.model.method.name == plan_dict["settings"]["model.method"]["value"]
    assert plan.resolved.training.objective.name == "sft"
    assert plan.resolved.distributed.zero_stage is None  # "auto" left by a plan without DeepSpeed
    assert json.dumps(plan.to_dict()) == json.dumps(plan_dict)  # derived, never serialised


def _refusal(d: dict) -> GpuplanError:
    with pytest.raises(GpuplanError) as e:
        Plan.from_dict(d)
    return e.value


def test_a_typo_in_a_key_is_refused_naming_both_keys(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    d["settings"]["training.sede"] = d["settings"].pop("training.seed")
    err = _refusal(d)
    assert {x.key for x in err.diagnostics} == {"training.sede", "training.seed"}
    assert any("unknown key training.sede" in x.summary for x in err.diagnostics)
    assert any("has no training.seed" in x.summary for x in err.diagnostics)


def test_a_missing_key_is_refused_naming_it(plan_dict):
    d = json.loads(json.dumps(plan_dict))
    del d["settings"]["output.dir"]
    err = _refusal(d)
    assert [x.key for x in err.diagnostics] == ["output.dir"]
    assert "re-run `gpuplan plan`" in (err.fix or "")


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("data.seq_len", "512", "data.seq_len = '512' in the plan is not an integer"),
        ("training.gradient_checkpointing", "auto", "training.gradient_checkpointing = 'auto' in the plan is not true or false"),
        ("model.method", "prefix", "model.method = 'prefix' in the plan is not 'full' | 'lora' | 'qlora'"),
        ("distributed.strategy", "auto", "distributed.strategy = 'auto' in the plan is not 'none' | 'ddp' | 'fsdp' | 'deepspeed'"),
        ("training.seed", True, "training.seed = True in the plan is not an integer"),
    ],
)
def test_a_wrongly_typed_value_is_refused_naming_the_key(plan_dict, key, value, message):
    d = json.loads(json.dumps(plan_dict))
    d["settings"][key]["value"] = value
    err = _refusal(d)
    assert [x.key for x in err.diagnostics] == [key]
    assert err.summary == message
