"""The parts of a vision-language model that train: the language model, and the vision tower when asked.

The plan names the parts by module-name prefix (plan.resolved.vision: tower_modules,
projector_modules, frozen_modules, lora_exclude; modelinfo/vision_families.py). A tower's attention
layers are often named like the language model's (SigLIP's q_proj / k_proj / v_proj in Idefics3,
gate/up/down_proj in Qwen2.5-VL's vision MLP), so the LoRA targets are matched with the frozen parts
excluded: peft LoraConfig(exclude_modules=...), a regex peft matches in full against each module name
(peft 0.21 tuners_utils.py check_target_module_exists). Under full fine-tuning the frozen parts (the
tower) get requires_grad False. With vision.train_tower nothing is frozen or excluded: full training
trains the tower too, and LoRA's targets reach the tower's layers of those names, as the plan counts them.
"""

from __future__ import annotations

from typing import Any

from gpuplan.plan.types import Plan


def is_vision_language(plan: Plan) -> bool:
    """The plan trains a vision-language model (plan.resolved.vision.family is set: plan/rules/vision.py)."""
    return plan.resolved.vision.is_vlm


def trains_tower(plan: Plan) -> bool:
    """The plan trains the vision tower (vision.train_tower; default frozen)."""
    return plan.resolved.vision.train_tower


def frozen_prefixes(plan: Plan) -> list[str]:
    """The module prefixes the plan keeps frozen (vision.frozen_modules): the tower, and the projector under LoRA."""
    return list(plan.resolved.vision.frozen_modules)


def lora_exclude(plan: Plan) -> str | None:
    """peft's exclude_modules regex, as the plan's adapter count assumes it (vision.lora_exclude)."""
    return plan.resolved.vision.lora_exclude


def under(name: str, prefix: str) -> bool:
    """`name` (a parameter's or module's) lies under `prefix`; a PeftModel puts "base_model.model." before the names."""
    return name.startswith(prefix + ".") or f".{prefix}." in f".{name}"


def freeze(model: Any, prefixes: list[str]) -> None:
    """requires_grad off for every parameter under `prefixes`."""
    for name, p in model.named_parameters():
        if any(under(name, pre) for pre in prefixes):
            p.requires_grad_(False)


def live_frozen(model: Any, prefixes: list[str]) -> list[str]:
    """Those of `prefixes` under which the live model trains no parameter (its requires_grad)."""
    names = [(n, p.requires_grad) for n, p in model.named_parameters()]
    return sorted(pre for pre in prefixes if not any(on for n, on in names if under(n, pre)))
