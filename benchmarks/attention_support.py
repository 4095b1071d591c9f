"""Regenerate gpuplan/modelinfo/attention_support.json from the installed transformers.

The attention rule (gpuplan/plan/rules/attention.py) must know which kernels each model
family accepts without importing transformers on the plan path, so the support flags
are read here, once, from each family's base model class (`_supports_sdpa`,
`_supports_flash_attn`, `_supports_flex_attn`: transformers' PreTrainedModel checks them
in `_check_and_adjust_attn_implementation` and raises for an unsupported kernel).

    python benchmarks/attention_support.py          # rewrite the table
    python benchmarks/attention_support.py --check  # exit 1 if it differs
    python benchmarks/attention_support.py --quick  # CI: the same check for the first 3 families only

tests/plan/test_attention_support.py runs the check, so an upgrade of transformers that
changes a family's support fails the suite until the table is regenerated.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "gpuplan" / "modelinfo" / "attention_support.json"


def read_support(limit: int | None = None) -> dict:
    """`limit`: only the first that many families (a quick check)."""
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    from gpuplan.modelinfo.registry import known_model_types

    families = {}
    for model_type in known_model_types()[:limit]:
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
    if "--quick" in argv:
        read = read_support(limit=3)
        stored = json.loads(TABLE.read_text())
        stale = [f for f, flags in read["families"].items() if stored["families"].get(f) != flags]
        if stale or stored["transformers"] != read["transformers"]:
            print(f"{TABLE} is out of date with the installed transformers ({stale}): run python {Path(__file__).name}")
            return 1
        print(f"{TABLE.name} is up to date: {len(read['families'])} families checked ({', '.join(read['families'])})")
        return 0
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
