"""Regenerate gpuplan/modelinfo/attention_support.json from the installed transformers.

The attention rule (gpuplan/plan/rules/attention.py) must know which kernels each model
family accepts without importing transformers on the plan path, so the support flags
are read here, once, from each family's base model class (`_supports_sdpa`,
`_supports_flash_attn`, `_supports_flex_attn`: transformers' PreTrainedModel checks them
in `_check_and_adjust_attn_implementation` and raises for an unsupported kernel).

    python benchmarks/attention_support.py          # rewrite the table
    python benchmarks/attention_support.py --check  # exit 1 if a family's flags differ
    python benchmarks/attention_support.py --quick  # CI: the same check for the first 3 families only

tests/plan/test_attention_support.py runs the check, so an upgrade of transformers that
changes a family's support fails the suite until the table is regenerated. The table's
"transformers" version says which release the flags were read from (the plan's reasons cite
it); a newer release that reads the same flags passes the check.
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


def stale_families(read: dict, stored: dict) -> list[str]:
    """The families whose flags the installed transformers reads differently from the table (or lacks)."""
    return sorted(f for f in read["families"].keys() | stored["families"].keys() if stored["families"].get(f) != read["families"].get(f))


def check(read: dict, stored: dict | None = None, *, only_read: bool = False) -> int:
    """Exit code of --check / --quick: 1 when a family's flags differ from `stored` (the table's file unless
    given; `only_read`: compare only the families read, the quick check). The version the table was read from
    is its provenance (the plan cites it), not part of the check: a transformers release that changes no
    family's flags passes, and says so."""
    stored = json.loads(TABLE.read_text()) if stored is None else stored
    if only_read:
        stored = {**stored, "families": {f: stored["families"].get(f) for f in read["families"]}}
    stale = stale_families(read, stored)
    if stale:
        installed = read["transformers"]
        print(f"{TABLE} is out of date with the installed transformers {installed} ({', '.join(stale)}): run python {Path(__file__).name}")
        return 1
    was, now = stored["transformers"], read["transformers"]
    same = "" if was == now else f", read from {was}, unchanged in {now}"
    print(f"{TABLE.name} is up to date: {len(read['families'])} families checked ({', '.join(read['families'])}){same}")
    return 0


def main(argv: list[str]) -> int:
    if "--quick" in argv:
        return check(read_support(limit=3), only_read=True)
    read = read_support()
    if "--check" in argv:
        return check(read)
    TABLE.write_text(render(read))
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
