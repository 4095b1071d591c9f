"""A plan's life after it is made: the drift and the state of the last apply, the run lock, the run directory.

drift.py and state.py compare a plan's fingerprint (plan/fingerprint.py, made when the plan is built).
drift.py        what changed between the last applied plan and this one
state.py        gpuplan-state.json: the applied plan, progress and results, read and written here
run_lock.py     one apply per output directory (the run lock; "lock" alone is the Hub pin file)
run_dir.py      the names of the files and folders a run writes in output.dir
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "fingerprint": "gpuplan.plan.fingerprint",
    "stale_reasons": "gpuplan.plan.fingerprint",
    "diff_plans": "gpuplan.lifecycle.drift",
    "resume_conflicts": "gpuplan.lifecycle.drift",
    "RunState": "gpuplan.lifecycle.state",
    "load_state": "gpuplan.lifecycle.state",
    "RunLock": "gpuplan.lifecycle.run_lock",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
