"""Spec -> Plan, torch-free: the rules, the memory model, the throughput estimate.

    plan_file(path, environment=local_environment()) -> Plan     (build.py)
    Plan, Setting, Change, Diagnostic, PlanError                   (types.py)
    HardwareSection, ModelSection, MemorySection, ThroughputSection (sections.py)

Modules: build.py runs the pipeline as named steps; inputs/ reads what a plan needs besides
the spec (this machine, the target, Hub pins); engine/ orders the rules (engine/graph.py) and
is what a rule sees (engine/resolver.py); rules/ holds the rules; fit/ searches the batch split
and memory savers that fit, and what would when nothing does; estimate/ prices a step's memory
(estimate/memory/) and time (estimate/throughput.py, estimate/step_time/); checks/ checks the
plan as a whole; types.py and sections.py hold the result, fingerprint.py what a saved plan must
still match. A plan after it is made (drift, the run state) is gpuplan/lifecycle/; docs/architecture.md maps every
module.
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "plan_file": "gpuplan.plan.build",
    "plan_spec": "gpuplan.plan.build",
    "Change": "gpuplan.plan.types",
    "Diagnostic": "gpuplan.plan.types",
    "Plan": "gpuplan.plan.types",
    "PlanError": "gpuplan.plan.types",
    "Setting": "gpuplan.plan.types",
    "HardwareSection": "gpuplan.plan.sections",
    "MemorySection": "gpuplan.plan.sections",
    "ModelSection": "gpuplan.plan.sections",
    "Saver": "gpuplan.plan.sections",
    "ThroughputSection": "gpuplan.plan.sections",
    "local_environment": "gpuplan.plan.inputs.environment",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
