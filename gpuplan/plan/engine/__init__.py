"""The rule engine: the rules' graph and what a rule sees while it runs.

graph.py     Rule, the topological order of the rules, GraphError
resolver.py  Resolver: the settings, changes and diagnostics a walk accumulates, typed internal nodes
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "Rule": "gpuplan.plan.engine.graph",
    "GraphError": "gpuplan.plan.engine.graph",
    "rule_order": "gpuplan.plan.engine.graph",
    "writers": "gpuplan.plan.engine.graph",
    "Resolver": "gpuplan.plan.engine.resolver",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
