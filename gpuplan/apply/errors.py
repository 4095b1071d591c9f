"""ApplyError, the error `apply` raises for a mistake the user can fix, is gpuplan.errors.ApplyError.

It carries the Diagnostic fields (key, summary, detail, fix) like every user-facing
error; this module keeps the import path apply code and tests use.
"""

from gpuplan.errors import ApplyError

__all__ = ["ApplyError"]
