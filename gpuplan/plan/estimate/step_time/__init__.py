"""The step-time model: a training step's time from named terms, without torch.

Measured runs scale its terms (plan/estimate/calibration.py); the advice that follows from
them is plan/checks/fixed_costs.py.

constants.py  per-architecture-class and global constants (fitted ones name their rows)
shape.py      the counts one device works through per micro-batch (tokens, params, kernels)
terms.py      matmuls, attention, memory-bound work, optimizer, fixed costs: cited formulas
model.py      the terms combined phase by phase (roofline), shares and what bounds the step
"""

from gpuplan.plan.estimate.step_time.model import GROUPS, StepTime, step_time
from gpuplan.plan.estimate.step_time.terms import Term

__all__ = ["GROUPS", "StepTime", "Term", "step_time"]
