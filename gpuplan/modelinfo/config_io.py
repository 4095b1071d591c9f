"""Read a model's config.json from disk, with errors a user can act on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuplan.modelinfo.errors import ModelConfigError

# Keys without which no family can be counted. The per-family counters fall back
# to the transformers Config defaults for everything else (defaults.py).
REQUIRED_KEYS = ("model_type",)


def read_config(path: str | Path) -> dict[str, Any]:
    """Load config.json (or <dir>/config.json) into a dict.

    Raises ModelConfigError for a missing file, invalid JSON (with line:col),
    a top level that is not an object, or a missing/invalid model_type.
    """
    p = Path(path)
    try:
        if p.is_dir():
            p = p / "config.json"
        exists = p.exists()
    except OSError as exc:  # ENAMETOOLONG, EACCES ...: is_dir/exists re-raise these
        raise ModelConfigError(p, f"cannot read the path: {exc.strerror or exc}") from None
    if not exists:
        raise ModelConfigError(
            p,
            "file not found; point model.config at a config.json or at a model directory containing one",
        )
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(p, f"cannot read the file: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{p}:{exc.lineno}:{exc.colno}", f"invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(p, f"expected a JSON object at the top level, got {type(data).__name__}")
    for key in REQUIRED_KEYS:
        if key not in data:
            raise ModelConfigError(
                p,
                f'missing required field {key!r}; add e.g. "{key}": "llama" (the value transformers writes in every config.json)',
            )
    if not isinstance(data["model_type"], str) or not data["model_type"]:
        raise ModelConfigError(p, f"field 'model_type' must be a non-empty string, got {data['model_type']!r}")
    return data
