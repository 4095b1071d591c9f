"""Spec -> Plan, torch-free: the rules, the memory model, the throughput estimate.

    plan_file(path, environment=local_environment()) -> Plan     (build.py)
    Plan, Setting, Change, Diagnostic, PlanError                   (types.py)
    HardwareSection, ModelSection, MemorySection, ThroughputSection (sections.py)

Modules: build.py assembles; context.py is what a rule sees; graph.py orders the
rules; rules/ holds them; solve.py searches the split that fits; memory/ prices one;
throughput.py and communication.py time it; fingerprint.py, drift.py and
environment.py tie a plan to the machine and to the last apply.
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
