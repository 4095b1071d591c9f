"""The plan as JSON: the format-1 contract of docs/design.md "Plan output"."""

from __future__ import annotations

import json
from typing import Any, Mapping


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
