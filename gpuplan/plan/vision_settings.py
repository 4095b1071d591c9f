"""The image side of a vision-language model's plan: tokens per image, what trains, what apply reads.

image_plan() turns [vision] of the spec and the model's VisionFacts into an ImagePlan (the
rule vision.images, plan/rules/vision.py, runs it and says why); derived_settings() writes it
into the plan's settings as vision.* keys, which apply reads as plan.resolved.vision
(plan/resolved.py VisionSettings).

What trains: the vision tower is frozen by default and only the language model is fine-tuned
(LoRA adapters on its linear layers, or its weights in full), as LLaMA-Factory
(freeze_vision_tower = true) and ms-swift (freeze_vit = true) default to: the tower was trained
on far more images than a fine-tuning set holds, and freezing it saves its gradients, optimizer
states and the activations backward would need. Under full fine-tuning the projector trains with
the language model (it maps the tower's features into it); under LoRA it stays frozen with the
tower. vision.train_tower = true trains all of it (LoRA: adapters on the tower and projector too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuplan.modelinfo.facts import ModelFacts, VisionFacts
from gpuplan.modelinfo.image_tokens import ImageTokens
from gpuplan.plan.types import Diagnostic, Setting

RULE = "vision.images"


@dataclass(frozen=True)
class ImagePlan:
    """What a VLM plan does with images (None for a text-only model)."""

    vision: VisionFacts
    width: int
    height: int
    images_per_example: int
    train_tower: bool
    tokens: ImageTokens  # one image through the processor
    processor_config: str | None  # the processor config read (a file or the model directory), None: the family defaults

    @property
    def tokens_per_example(self) -> int:
        return self.images_per_example * self.tokens.tokens

    def frozen_modules(self, adapters: bool) -> tuple[str, ...]:
        """Module prefixes that do not train: the tower (and, under LoRA, the projector) unless train_tower."""
        if self.train_tower:
            return ()
        v = self.vision
        return v.tower_modules + v.projector_modules if adapters else v.tower_modules

    def lora_exclude(self) -> str | None:
        """peft LoraConfig(exclude_modules=...): a regex re.fullmatch-ed against each module name
        (peft/tuners/tuners_utils.py check_target_module_exists)."""
        frozen = self.frozen_modules(adapters=True)
        if not frozen:
            return None
        return "(" + "|".join(re.escape(p) for p in frozen) + r")(\..*)?"


def derived_settings(plan: ImagePlan | None, method: str) -> dict[str, Setting]:
    """The vision.* keys the plan derives (none for a text-only model)."""
    if plan is None:
        return {}
    v = plan.vision
    adapters = method in ("lora", "qlora")
    frozen = plan.frozen_modules(adapters)
    trains = (
        "everything trains (vision.train_tower = true)"
        if plan.train_tower
        else ("frozen by default: only the language model is fine-tuned" + (" (LoRA on its linear layers)" if adapters else ""))
    )
    values: dict[str, tuple[Any, str]] = {
        "vision.family": (v.family, f"config.json model_type {v.family!r} is a vision-language model: AutoModelForImageTextToText"),
        "vision.image_tokens": (plan.tokens.tokens, f"one {plan.width}x{plan.height} image: {plan.tokens.how}"),
        "vision.image_token_id": (v.image_token_id, "the config's image placeholder token"),
        "vision.tower_modules": (list(v.tower_modules), f"the vision tower: {v.tower_params:,} parameters"),
        "vision.projector_modules": (list(v.projector_modules), f"the projector: {v.projector_params:,} parameters"),
        "vision.language_model_modules": (list(v.language_model_modules), f"the language model: {v.language_model_params:,} parameters"),
        "vision.frozen_modules": (list(frozen), trains),
        "vision.lora_exclude": (
            plan.lora_exclude() if adapters else None,
            "peft LoraConfig(exclude_modules=...): no adapters on the frozen tower and projector" if adapters else "no LoRA",
        ),
    }
    return {k: Setting(val, "derived", why, RULE) for k, (val, why) in values.items()}


def vision_summary(plan: ImagePlan) -> dict[str, Any]:
    """What the plan prints about the images."""
    return {
        "image_size": [plan.width, plan.height],
        "images_per_example": plan.images_per_example,
        "image_tokens": plan.tokens.tokens,
        "placeholder_tokens": plan.tokens.placeholders,
        "tower_images": plan.tokens.tower_images,
        "tower_tokens": plan.tokens.tower_tokens,
        "resized": list(plan.tokens.resized),
    }


def is_vlm(facts: ModelFacts) -> bool:
    return facts.vision is not None


def images_note(plan: ImagePlan | None, method: str, seq_len: int, checkpointing: bool = False) -> Diagnostic | None:
    """What the plan prints about the images and the tower (a note)."""
    if plan is None:
        return None
    v, t = plan.vision, plan.tokens
    adapters = method in ("lora", "qlora")
    # gradient checkpointing's enable_input_require_grads (modeling_utils.py, transformers 5.25) hooks every
    # sub-model's input embeddings; mllama's tower has no checkpointed blocks, so its frozen blocks record
    # autograd and backward runs through them for their inputs' gradients (memory/vision.py tower_memory)
    backward = (
        "backward still runs through its blocks (gradient checkpointing's input hook on its patch embedding records them)"
        if checkpointing and v.family == "mllama"
        else "backward does not run through it"
    )
    if plan.train_tower:
        trains = "the vision tower and projector train too (vision.train_tower = true)"
    elif adapters:
        trains = (
            f"the vision tower ({v.tower_params / 1e6:,.0f}M parameters) and projector ({v.projector_params / 1e6:,.0f}M) are frozen "
            "and LoRA trains the language model's linear layers only: the tower was trained on far more images than a fine-tuning "
            f"set holds, and frozen it has no gradients or optimizer states and {backward} "
            "(vision.train_tower = true trains it)"
        )
    else:
        trains = (
            f"the vision tower ({v.tower_params / 1e6:,.0f}M parameters) is frozen; the projector ({v.projector_params / 1e6:,.0f}M) and "
            f"the language model train: frozen, the tower has no gradients or optimizer states and {backward} "
            "(vision.train_tower = true trains it)"
        )
    summary = (
        f"images: {plan.images_per_example} x {t.tokens:,} tokens per example ({plan.width}x{plan.height} px: {t.how}), "
        f"{plan.tokens_per_example:,} of data.seq_len {seq_len:,}"
    )
    detail = f"the tower encodes {t.tower_images} image(s) of {t.tower_tokens:,} tokens per image; {trains}"
    return Diagnostic("note", "vision.image_size", summary, detail=detail)
