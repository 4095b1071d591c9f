"""The plan as JSON: the format-1 contract of docs/design.md "Plan output"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
