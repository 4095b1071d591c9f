"""ApplyError, the error `apply` raises for a mistake the user can fix, is gpuplan.errors.ApplyError.

It carries the Diagnostic fields (key, summary, detail, fix) like every user-facing
error; this module keeps the import path apply code and tests use, and the fix REPLAN.
"""

from gpuplan.errors import ApplyError

__all__ = ["REPLAN", "ApplyError"]

# the fix for a plan value apply cannot take: the planner resolves it
REPLAN = "re-run `gpuplan plan` to resolve it"
