"""Which attention kernels each model family accepts, as data (no transformers import).

attention_support.json is read from the installed transformers by
benchmarks/attention_support.py (each base model class's `_supports_sdpa`,
`_supports_flash_attn`, `_supports_flex_attn`); tests/plan/test_attention_support.py fails
when the installed transformers disagrees with it.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    return json.loads(resources.files("gpuplan.modelinfo").joinpath("attention_support.json").read_text("utf-8"))


def attention_support(model_type: str) -> dict[str, bool] | None:
    """{"sdpa": ..., "flash_attention_2": ..., "flex_attention": ...}; None for a family not in the table."""
    return _table()["families"].get(model_type)


def support_source() -> str:
    return f"transformers {_table()['transformers']}"
