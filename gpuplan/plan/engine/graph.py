"""The plan graph: settings and rules as a networkx DAG, walked in topological order.

Every key has two nodes: `spec:KEY` (what the spec says, a source) and `KEY` (the
resolved value). A rule reads resolved keys (so it runs after their writer) and/or
spec keys (no ordering), and writes resolved keys. A key no rule writes resolves to
its spec value. Two rules writing one key, or a cycle, is a programming error
(GraphError), caught by tests/plan/test_plan_graph.py.

networkx is the graph (build_graph: for inspection, tests and naming a cycle), but it
is imported only when build_graph runs: `import networkx` pulls in its whole algorithm
library, the largest single import of `gpuplan plan` (benchmarks/RESULTS.md, Plan
speed). The plan path needs one topological order of about 40 nodes, which
_lexicographic_order computes with the same tie-breaking as
nx.lexicographical_topological_sort (Kahn's algorithm, smallest ready node first);
tests/plan/test_plan_graph.py checks the two agree.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import networkx as nx

    from gpuplan.plan.engine.resolver import Resolver

SPEC = "spec:"
INTERNAL = "internal:"  # a value rules pass on that is not a setting (the fit solver's solution)

T = TypeVar("T")


class Node(str, Generic[T]):
    """An internal graph node: a key rules pass a typed value through (`ctx.get(node) -> T`).

    It is the key string itself (`internal:fit.solution`), so the graph, the declared reads
    and writes and the Resolver's store treat it like any key; the type parameter tells the
    type checker what `Resolver.get` returns for it."""

    __slots__ = ()

    def __new__(cls, name: str) -> Node[T]:
        return super().__new__(cls, INTERNAL + name)


@dataclass(frozen=True)
class Rule:
    """A planning rule: reads some settings, writes others, explains itself.

    `reads` name resolved keys ("training.fp16") or spec values ("spec:training.fp16").
    """

    id: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    apply: Callable[[Resolver], None]
    doc: str = ""
    # Finer ids a Change of this rule may carry (batch.tensor_core_multiple inside batch.split).
    explains: tuple[str, ...] = ()


class GraphError(Exception):
    """The rule set itself is wrong (a bug in gpuplan, not a user mistake)."""


def build_graph(rules: Iterable[Rule]) -> nx.DiGraph:
    import networkx as nx

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
            g.nodes[n]["kind"] = "spec" if n.startswith(SPEC) else "internal" if n.startswith(INTERNAL) else "setting"
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
    edges = _edges(rules)
    order = _lexicographic_order(edges)
    if order is None:  # a cycle or a malformed rule set: let networkx find and name it
        build_graph(rules)
        raise GraphError("rule graph has no topological order")  # pragma: no cover - build_graph raised
    by_node = {f"rule:{r.id}": r for r in rules}
    return tuple(by_node[n] for n in order if n in by_node)


def _edges(rules: tuple[Rule, ...]) -> dict[str, set[str]]:
    """node -> successors, the same nodes and edges as build_graph (validation is build_graph's)."""
    succ: dict[str, set[str]] = {}
    seen: set[str] = set()
    writer: set[str] = set()
    for rule in rules:
        node = f"rule:{rule.id}"
        if node in seen or any(k.startswith(SPEC) or k in writer for k in rule.writes):
            return {"": {""}}  # a self-loop: no order, build_graph reports what is wrong
        seen.add(node)
        writer.update(rule.writes)
        succ.setdefault(node, set())
        for key in rule.writes:
            succ[node].add(key)
            succ.setdefault(key, set())
        for key in rule.reads:
            succ.setdefault(key, set()).add(node)
    return succ


def _lexicographic_order(succ: dict[str, set[str]]) -> list[str] | None:
    """Kahn's algorithm taking the smallest ready node first; None when there is a cycle."""
    indegree = dict.fromkeys(succ, 0)
    for targets in succ.values():
        for t in targets:
            indegree[t] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for t in succ[n]:
            indegree[t] -= 1
            if indegree[t] == 0:
                heapq.heappush(ready, t)
    return order if len(order) == len(succ) else None


def writers(rules: Iterable[Rule]) -> dict[str, str]:
    """key -> id of the rule that writes it."""
    return {k: r.id for r in rules for k in r.writes}
