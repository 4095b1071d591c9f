"""The spec: a TOML file, read, validated or formatted (a starter spec is gpuplan/init/).

load_toml(path) -> LoadedSpec        (load.py: refusals name the file, line and column)
validate_spec(raw) -> Spec           (validate.py over schema.py: every problem at once)
format_spec_text(text) -> str        (fmt.py: `gpuplan fmt`)
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "LoadedSpec": "gpuplan.spec.load",
    "load_toml": "gpuplan.spec.load",
    "validate_spec": "gpuplan.spec.validate",
    "Spec": "gpuplan.spec.schema",
    "format_spec_text": "gpuplan.spec.fmt",
    "read_spec_text": "gpuplan.spec.fmt",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
