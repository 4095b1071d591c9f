"""Regenerate gpuplan/modelinfo/attention_support.json from the installed transformers.

The attention rule (gpuplan/plan/rules/attention.py) must know which kernels each model
family accepts without importing transformers on the plan path, so the support flags
are read here, once, from each family's base model class (`_supports_sdpa`,
`_supports_flash_attn`, `_supports_flex_attn`: transformers' PreTrainedModel checks them
in `_check_and_adjust_attn_implementation` and raises for an unsupported kernel).

    python benchmarks/attention_support.py          # rewrite the table
    python benchmarks/attention_support.py --check  # exit 1 if it differs

tests/plan/test_attention_support.py runs the check, so an upgrade of transformers that
changes a family's support fails the suite until the table is regenerated.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "gpuplan" / "modelinfo" / "attention_support.json"


def read_support() -> dict:
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from gpuplan.modelinfo.registry import known_model_types

    families = {}
    for model_type in known_model_types():
        module = model_type_to_module_name(model_type)
        cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), MODEL_MAPPING_NAMES[model_type])
        families[model_type] = {
            "sdpa": bool(cls._supports_sdpa),
            "flash_attention_2": bool(cls._supports_flash_attn),
            "flex_attention": bool(cls._supports_flex_attn),
        }
    return {
        "transformers": transformers.__version__,
        "source": "PreTrainedModel._supports_sdpa / _supports_flash_attn / _supports_flex_attn of each base model class",
        "families": families,
    }


def render(table: dict) -> str:
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render(read_support())
    if "--check" in argv:
        if TABLE.read_text() != text:
            print(f"{TABLE} is out of date with the installed transformers: run python {Path(__file__).name}")
            return 1
        return 0
    TABLE.write_text(text)
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
