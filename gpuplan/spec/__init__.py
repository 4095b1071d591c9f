"""The spec: a TOML file, read, validated, formatted, or written as a starter.

    load_toml(path) -> LoadedSpec        (load.py: refusals name the file, line and column)
    validate_spec(raw) -> Spec           (validate.py over schema.py: every problem at once)
    format_spec_text(text) -> str        (fmt.py: `gpuplan fmt`)
    starter_spec(config, gpu, ...) -> str (starter.py: `gpuplan init`)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LoadedSpec": "gpuplan.spec.load",
    "load_toml": "gpuplan.spec.load",
    "validate_spec": "gpuplan.spec.validate",
    "Spec": "gpuplan.spec.schema",
    "format_spec_text": "gpuplan.spec.fmt",
    "read_spec_text": "gpuplan.spec.fmt",
    "starter_spec": "gpuplan.spec.starter",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import on first use: naming the API costs no import time (tests/test_plan_imports.py)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
