"""Checks of a whole plan that are not rules: the data files on disk, run-length advice.

data_files.py  the files the run will read exist (their rows' fields: spec/data_fields.py)
advice.py      whole-plan advice (a long run, auto resolved to the CPU)
fixed_costs.py when fixed costs dominate the step: the larger batch or packing that amortises them
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "data_file_problems": "gpuplan.plan.checks.data_files",
    "auto_resolved_to_cpu": "gpuplan.plan.checks.advice",
    "long_run": "gpuplan.plan.checks.advice",
    "fixed_costs_advice": "gpuplan.plan.checks.fixed_costs",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
