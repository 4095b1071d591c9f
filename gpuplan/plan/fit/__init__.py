"""The fit search: which split, savers and method make a run fit, and what to say when none does.

search.py                FitProblem, the ladder of savers, solve()
savers.py                the saver table: every memory saver's knob, cost, wording and availability
fixes.py                 the no-fit record: one-key fixes, each verified by the same model
hardware_alternatives.py larger GPUs and more GPUs that fit, each planned in full
method_alternatives.py   adapter methods that fit when the spec's method does not
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "FitProblem": "gpuplan.plan.fit.search",
    "FitSolution": "gpuplan.plan.fit.search",
    "solve": "gpuplan.plan.fit.search",
    "verified_fixes": "gpuplan.plan.fit.fixes",
    "hardware_alternatives": "gpuplan.plan.fit.hardware_alternatives",
    "adapter_alternatives": "gpuplan.plan.fit.method_alternatives",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
