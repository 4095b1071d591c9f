"""The plan graph: settings and rules as a networkx DAG, walked in topological order.

Every key has two nodes: `spec:KEY` (what the spec says, a source) and `KEY` (the
resolved value). A rule reads resolved keys (so it runs after their writer) and/or
spec keys (no ordering), and writes resolved keys. A key no rule writes resolves to
its spec value. Two rules writing one key, or a cycle, is a programming error
(GraphError), caught by tests/test_plan_graph.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import networkx as nx

if TYPE_CHECKING:
    from gpuplan.plan.context import Resolver

SPEC = "spec:"


@dataclass(frozen=True)
class Rule:
    """A planning rule: reads some settings, writes others, explains itself.

    `reads` name resolved keys ("training.fp16") or spec values ("spec:training.fp16").
    """

    id: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    apply: Callable[["Resolver"], None]
    doc: str = ""


class GraphError(Exception):
    """The rule set itself is wrong (a bug in gpuplan, not a user mistake)."""


def build_graph(rules: Iterable[Rule]) -> nx.DiGraph:
    g = nx.DiGraph()
    writer: dict[str, str] = {}
    for rule in rules:
        node = f"rule:{rule.id}"
        if node in g:
            raise GraphError(f"two rules share the id {rule.id!r}")
        g.add_node(node, kind="rule", rule=rule)
        for key in rule.writes:
            if key.startswith(SPEC):
                raise GraphError(f"rule {rule.id} writes {key}: spec values are inputs")
            if key in writer:
                raise GraphError(f"rules {writer[key]} and {rule.id} both write {key}")
            writer[key] = rule.id
            g.add_edge(node, key)
        for key in rule.reads:
            g.add_edge(key, node)
    for n in g.nodes:
        if "kind" not in g.nodes[n]:
            g.nodes[n]["kind"] = "spec" if n.startswith(SPEC) else "setting"
    if not nx.is_directed_acyclic_graph(g):
        cycle = nx.find_cycle(g)
        raise GraphError("rule cycle: " + " -> ".join(str(a) for a, _ in cycle))
    return g


def rule_order(rules: Iterable[Rule]) -> list[Rule]:
    """Rules in an order where every writer of a key runs before its readers.

    Ties are broken by rule id so the order, and so the plan, is deterministic. The
    order of one rule set is computed once per process (`compare` plans many times).
    """
    return list(_rule_order(tuple(rules)))


@functools.lru_cache(maxsize=8)
def _rule_order(rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
    g = build_graph(rules)
    order = nx.lexicographical_topological_sort(g)
    return tuple(g.nodes[n]["rule"] for n in order if g.nodes[n]["kind"] == "rule")


def writers(rules: Iterable[Rule]) -> dict[str, str]:
    """key -> id of the rule that writes it."""
    return {k: r.id for r in rules for k in r.writes}
