"""apply: execute a Plan with transformers.Trainer (the only heavy part of gpuplan).

Importing this package is cheap; torch and transformers load when `execute` runs.

    from gpuplan.apply import execute, ApplyError
    results = execute(plan)            # trains, writes output.dir, returns the results
"""

from __future__ import annotations

from typing import Any

from gpuplan.apply.errors import ApplyError

__all__ = ["ApplyError", "execute"]


def __getattr__(name: str) -> Any:
    if name == "execute":
        from gpuplan.apply.train.execute import execute

        return execute
    raise AttributeError(name)
