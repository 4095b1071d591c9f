"""The plan package's rooms import downwards only (issue 19).

- estimate/ (the pure cost models) never imports the rule engine, the rules, the fit search,
  the checks or the pipeline: a cost model is a function of a workload, not of a walk;
- checks/ and lifecycle/ import only the plan's data types (types, sections, the method and objective
  descriptors) and the package's leaf modules (errors, units, the GPU profile);
- engine/ imports no rule, cost model or pipeline.

Imports under `if TYPE_CHECKING:` are annotations, not dependencies, and are not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gpuplan"

LEAVES = ("gpuplan.errors", "gpuplan.units", "gpuplan.hardware.profile", "gpuplan.lazy", "gpuplan.fsutil")
# the plan's data types; Workload (estimate/memory/types.py) is the memory section's record of the run
DATA_TYPES = (
    "gpuplan.plan.types",
    "gpuplan.plan.sections",
    "gpuplan.plan.methods",
    "gpuplan.spec.objectives",
    "gpuplan.plan.estimate.memory.types",
    # the image parts of a chat row: the data's format, read by the plan's image check and by apply alike
    "gpuplan.spec.chat_images",
    "gpuplan.spec.parquet_images",
)
HIGHER = (
    "gpuplan.plan.engine",
    "gpuplan.plan.rules",
    "gpuplan.plan.fit",
    "gpuplan.plan.checks",
    "gpuplan.plan.build",
    "gpuplan.plan.compare",
    "gpuplan.plan.inputs",
    "gpuplan.lifecycle",
    "gpuplan.apply",
    "gpuplan.cli",
)


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def runtime_imports(path: Path) -> set[str]:
    """Every gpuplan module `path` imports at run time, at the top or inside functions."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    return imports_of(path.read_text(), package)


def imports_of(source: str, package: str, modules: Collection[str] | None = None) -> set[str]:
    """The gpuplan modules `source` (a module of `package`) imports, TYPE_CHECKING blocks aside.

    Without `modules`, `from pkg import name` counts both pkg and pkg.name (a name imported from a
    package may be a module). With the package's module names given, it counts pkg.name when that is
    a module and pkg (its __init__) otherwise: the exact graph tests/test_layers.py checks for cycles."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name.startswith("gpuplan"))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    name = f"{base}.{child.module}" if child.module else base
                else:
                    name = child.module or ""
                if name.startswith("gpuplan") and modules is None:
                    out.add(name)
                    # `from gpuplan.plan import build`: a name imported from a package may be a module
                    out.update(f"{name}.{a.name}" for a in child.names if a.name != "*")
                elif name.startswith("gpuplan"):
                    out.update(f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name for a in child.names)
            visit(child)

    visit(ast.parse(source))
    return out


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _files(room: str) -> list[Path]:
    files = sorted((PKG / room).rglob("*.py"))
    assert files, room
    return files


@pytest.mark.parametrize("path", _files("plan/estimate"), ids=lambda p: str(p.relative_to(PKG)))
def test_estimate_never_imports_the_engine_or_anything_above_it(path):
    bad = sorted(m for m in runtime_imports(path) if _under(m, HIGHER))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", _files("plan/checks") + _files("lifecycle"), ids=lambda p: str(p.relative_to(PKG)))
def test_checks_and_lifecycle_import_only_the_data_types(path):
    allowed = LEAVES + DATA_TYPES + (_module(path).rsplit(".", 1)[0],)
    bad = sorted(m for m in runtime_imports(path) if not _under(m, allowed))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", _files("plan/engine"), ids=lambda p: str(p.relative_to(PKG)))
def test_engine_imports_no_rule_cost_model_or_pipeline(path):
    bad = sorted(
        m
        for m in runtime_imports(path)
        if _under(
            m,
            (
                "gpuplan.plan.rules",
                "gpuplan.plan.fit",
                "gpuplan.plan.estimate",
                "gpuplan.plan.build",
                "gpuplan.plan.checks",
                "gpuplan.plan.compare",
            ),
        )
    )
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_checker_sees_imports_inside_functions_and_skips_type_checking_blocks():
    src = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpuplan.plan.engine.resolver import Resolver\n"
        "def f():\n    from gpuplan.plan.fit.search import solve\n    from .memory import estimate\n    return solve\n"
    )
    assert imports_of(src, "gpuplan.plan.estimate") == {
        "gpuplan.plan.fit.search",
        "gpuplan.plan.fit.search.solve",
        "gpuplan.plan.estimate.memory",
        "gpuplan.plan.estimate.memory.estimate",
    }
    # a module imported from its package by name is seen as that module
    assert _under_any(imports_of("from gpuplan.plan import build\nfrom .. import fit\n", "gpuplan.plan.estimate"), HIGHER) == {
        "gpuplan.plan.build",
        "gpuplan.plan.fit",
    }


def _under_any(names: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {m for m in names if _under(m, prefixes)}
