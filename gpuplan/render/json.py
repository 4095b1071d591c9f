"""The plan as JSON: the format-1 contract of DESIGN.md "Plan output"."""

from __future__ import annotations

import json
from typing import Any, Mapping

from gpuplan.plan.types import Plan


def plan_dict(plan: Plan) -> dict[str, Any]:
    return plan.to_dict()


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
