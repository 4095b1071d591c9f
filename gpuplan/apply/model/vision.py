"""The parts of a vision-language model: its vision tower, its projector, its language model; which train.

transformers 5.24 names the parts per family (the modeling files' `*Model.__init__`):
- Idefics3 / SmolVLM: `model.vision_model` (SigLIP), `model.connector` (pixel shuffle + linear), `model.text_model`
- Qwen2-VL / Qwen2.5-VL: `model.visual` (the patch merger, its projector, inside it), `model.language_model`
- LLaVA(-NeXT), Gemma 3: `model.vision_tower`, `model.multi_modal_projector`, `model.language_model`
- mllama: `model.vision_model`, `model.multi_modal_projector`, `model.language_model`
The tower's attention layers are often named like the language model's (SigLIP's q_proj / k_proj /
v_proj), so LoRA targets are matched with the tower and projector excluded (peft LoraConfig
exclude_modules, a regex matched in full against each module name: peft tuners_utils.py
check_target_module_exists). By default the tower and projector stay frozen and LoRA (or full
training) reaches the language model only; `train_tower` trains both in full.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from gpuplan.plan.types import Plan

TOWER_NAMES = ("vision_model", "vision_tower", "visual")
PROJECTOR_NAMES = ("connector", "multi_modal_projector")


def _planned(plan: Plan) -> Any:
    """plan.resolved.vision (plan/resolved.py VisionSettings), or None in a plan made before it existed."""
    return getattr(plan.resolved, "vision", None)


def is_vision_language(plan: Plan) -> bool:
    """The plan trains a vision-language model: plan.resolved.vision.family is set (in a plan made before the
    vision section, the model's config.json has a vision_config)."""
    planned = _planned(plan)
    if planned is not None:
        return planned.family is not None
    from gpuplan.hub.fetch import model_dir

    d = model_dir(plan.resolved.model.hub) if plan.resolved.model.hub is not None else None
    path = plan.resolved.model.config or (os.path.join(d, "config.json") if d else None)
    if not path or not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            return "vision_config" in json.load(f)
    except (OSError, ValueError):
        return False


def trains_tower(plan: Plan) -> bool:
    """The plan trains the vision tower (vision.train_tower; default frozen)."""
    planned = _planned(plan)
    return bool(planned.train_tower) if planned is not None else False


def frozen_prefixes(plan: Plan, model: Any) -> list[str]:
    """The module prefixes the plan keeps frozen (vision.frozen_modules), else the live tower and projector."""
    planned = _planned(plan)
    if planned is not None:
        return list(planned.frozen_modules)
    if trains_tower(plan):
        return []
    return [p for ps in part_prefixes(model).values() for p in ps]


def lora_exclude(plan: Plan, model: Any) -> str | None:
    """peft's exclude_modules regex: the plan's (vision.lora_exclude), else built from the frozen prefixes."""
    planned = _planned(plan)
    if planned is not None:
        return planned.lora_exclude
    prefixes = frozen_prefixes(plan, model)
    return "(" + "|".join(re.escape(p) for p in prefixes) + r")(\..*)?" if prefixes else None


def freeze(model: Any, prefixes: list[str]) -> int:
    """requires_grad off for every parameter under `prefixes` (a PeftModel's names carry a
    "base_model.model." before them); returns how many parameters that froze."""
    n = 0
    for name, p in model.named_parameters():
        if any(_under(name, pre) for pre in prefixes):
            p.requires_grad_(False)
            n += p.numel()
    return n


def unfreeze(model: Any, prefixes: list[str]) -> None:
    for name, p in model.named_parameters():
        if any(_under(name, pre) for pre in prefixes) and p.dtype.is_floating_point:
            p.requires_grad_(True)


def _under(name: str, prefix: str) -> bool:
    return name.startswith(prefix + ".") or f".{prefix}." in f".{name}"


def part_prefixes(model: Any) -> dict[str, list[str]]:
    """{"tower": [...], "projector": [...]}: the module names of each part in `model` (a PeftModel's base too)."""
    out: dict[str, list[str]] = {"tower": [], "projector": []}
    for name, _ in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        inside = any(name.startswith(p + ".") for ps in out.values() for p in ps)
        if inside or parent.endswith(tuple(TOWER_NAMES + PROJECTOR_NAMES)):
            continue
        if leaf in TOWER_NAMES:
            out["tower"].append(name)
        elif leaf in PROJECTOR_NAMES:
            out["projector"].append(name)
    return out


def part_of(name: str, parts: dict[str, list[str]]) -> str:
    """"tower", "projector" or "language" for a parameter or module name."""
    for part, prefixes in parts.items():
        if any(_under(name, p) for p in prefixes):
            return part
    return "language"


def trainable_by_part(model: Any) -> dict[str, int]:
    """Trainable parameters of the live model by part ("tower", "projector", "language"), from requires_grad."""
    parts = part_prefixes(model)
    out = {"tower": 0, "projector": 0, "language": 0}
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[part_of(name, parts)] += p.numel()
    return out
