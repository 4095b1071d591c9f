"""One layer order for the whole package (issue 29), and no import cycle.

    leaves (errors, units, ...) -> hardware -> modelinfo -> hub -> spec -> plan -> lifecycle -> clusters
    -> render -> apply -> after -> trace -> init -> cli

A module imports only from its own top-level room or a room to its left. apply/ is below
after/ and trace/ because those load what apply trains (and the sample prompts generate while
it trains); init/ plans a draft spec, so it sits above the plan and the renderers. Imports
inside functions count (they are imports all the same); imports under `if TYPE_CHECKING:`
are annotations and do not. The checker is tests/plan/test_plan_layering.py's, which also
holds the rules between the plan's own rooms.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from tests.plan.test_plan_layering import imports_of

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gpuplan"

LAYERS = (
    ("gpuplan", "gpuplan.errors", "gpuplan.units", "gpuplan.lazy", "gpuplan.fsutil", "gpuplan.toml_value"),
    ("gpuplan.hardware",),
    ("gpuplan.modelinfo",),
    ("gpuplan.hub",),
    ("gpuplan.spec",),
    ("gpuplan.plan",),
    ("gpuplan.lifecycle",),
    ("gpuplan.clusters",),
    ("gpuplan.render",),
    ("gpuplan.apply",),
    ("gpuplan.after",),
    ("gpuplan.trace",),
    ("gpuplan.init",),
    ("gpuplan.cli", "gpuplan.__main__"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def room(name: str) -> str:
    """The top-level room a module belongs to (the longest LAYERS entry it is under)."""
    best = ""
    for layer in LAYERS:
        for r in layer:
            if (name == r or name.startswith(r + ".")) and len(r) > len(best):
                best = r
    return best


def rank(name: str) -> int:
    r = room(name)
    return next(i for i, layer in enumerate(LAYERS) if r in layer)


def module_imports(name: str) -> set[str]:
    """The gpuplan modules `name` imports at run time: `from pkg import sub` of a module `sub` is
    pkg.sub; `from pkg import NAME` of anything else is the package pkg (its __init__)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    return {m for m in imports_of(path.read_text(), package, MODULES) if m in MODULES and m != name}


def test_every_module_has_a_room():
    assert not [m for m in MODULES if not room(m)]


@pytest.mark.parametrize("name", sorted(MODULES), ids=str)
def test_imports_go_down_the_layers(name):
    here = rank(name)
    up = sorted(m for m in module_imports(name) if rank(m) > here)
    assert not up, f"{name} ({room(name)}) imports {up}, above it in the layer order"


def test_no_import_cycle():
    g = nx.DiGraph()
    for name in MODULES:
        g.add_node(name)
        g.add_edges_from((name, m) for m in module_imports(name))
    cycles = sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checker_sees_an_upward_import():
    # the rank of a room, and an import from a room above, as the tests above read them
    assert rank("gpuplan.apply.train.execute") > rank("gpuplan.plan.build") > rank("gpuplan.spec.schema")
    assert rank("gpuplan.after.load") > rank("gpuplan.apply.model.load")
    src = "def f():\n    from gpuplan.cli.main import main\n"
    assert "gpuplan.cli.main" in imports_of(src, "gpuplan.plan")
