"""A plan's life after it is made: its fingerprint and the drift against the last apply.

fingerprint.py  the hash of what a plan does (what apply and drift compare)
drift.py        what changed between the last applied plan and this one
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "fingerprint": "gpuplan.lifecycle.fingerprint",
    "stale_reasons": "gpuplan.lifecycle.fingerprint",
    "diff_plans": "gpuplan.lifecycle.drift",
    "resume_conflicts": "gpuplan.lifecycle.drift",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
