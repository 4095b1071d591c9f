"""Package APIs named in __all__ and imported on first use (PEP 562 module __getattr__).

Naming a package's API costs no import time: `import gpuplan.plan` stays torch-free and
fast (tests/plan/test_plan_imports.py), and each name resolves when it is first read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: name -> the module that defines it."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
