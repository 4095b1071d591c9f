"""The spec as settings: one Setting per key, user-set or default, paths resolved against the spec.

Paths resolve relative to the spec file, so a spec plans the same from anywhere; a Hub id
stays as written (gpuplan/hub resolves it, plan/inputs/sources.py pins it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpuplan.hub.ids import is_hub_id
from gpuplan.plan.types import Setting
from gpuplan.spec.chat_templates import CHAT_TEMPLATES
from gpuplan.spec.schema import SECTIONS, Spec

PATH_KEYS = (
    "model.config",
    "model.name_or_path",
    "output.dir",
    "preference.reference_model",
    "eval.include_path",
    "vision.processor_config",
)
PATH_LIST_KEYS = ("data.train_files", "data.eval_files")


def flatten(spec: Spec, spec_dir: Path, spec_stem: str) -> dict[str, Setting]:
    """Every key of every section, as the spec gives it (user) or the default.

    Paths resolve relative to the spec file, so a spec plans the same from anywhere.
    """
    out: dict[str, Setting] = {}
    for section in SECTIONS:
        obj = getattr(spec, section)
        for name in type(obj).model_fields:
            key = f"{section}.{name}"
            value = getattr(obj, name)
            if key == "model.name_or_path" and value is not None and is_hub_id(value, spec_dir):
                pass  # a Hub id stays as written; gpuplan/hub resolves it
            elif key == "data.chat_template" and value is not None and value not in CHAT_TEMPLATES:
                value = str((spec_dir / value).resolve())
            elif key in PATH_KEYS and value is not None:
                value = str((spec_dir / value).resolve())
            elif key in PATH_LIST_KEYS:
                value = [str((spec_dir / v).resolve()) for v in value]
            out[key] = Setting(value, "user" if name in obj.model_fields_set else "default")
    if out["output.dir"].value is None:
        out["output.dir"] = Setting(str((Path.cwd() / "runs" / spec_stem).resolve()), "default")
    if out["training.run_name"].value is None:  # trackers name the run after the spec
        out["training.run_name"] = Setting(spec_stem, "default")
    return out


def output_dir(settings: Mapping[str, Setting]) -> str:
    """output.dir of flattened spec settings (always set: flatten gives it a default)."""
    return str(settings["output.dir"].value)
