"""vision.images: a vision-language model's images, in tokens (modelinfo/image_tokens.py).

- [vision] on a text-only model is an error naming the key (the model cannot take images).
- A VLM needs vision.image_size: the processor's token count depends on it.
- vision.images_per_example: "auto" -> 1 for a VLM.
- Every example's images count in data.seq_len: images x tokens per image must leave room for text.
The ImagePlan it writes (plan/vision_settings.py) sizes the tower's memory and time (memory.fit)
and keeps LoRA off the frozen tower (lora.config).
"""

from __future__ import annotations

import os

from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.image_tokens import PROCESSOR_FILES, image_tokens, processor_config
from gpuplan.modelinfo.vision_families import VLM_FAMILIES
from gpuplan.plan.engine.graph import Node, Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.vision_settings import ImagePlan

IMAGE_PLAN: Node[ImagePlan | None] = Node("vision.image_plan")
KEYS = ("vision.image_size", "vision.images_per_example", "vision.train_tower", "vision.processor_config")


def _processor_path(ctx: Resolver) -> str | None:
    """vision.processor_config, else the model directory (its processor_config.json / preprocessor_config.json),
    else None (the family defaults)."""
    given = ctx.spec("vision.processor_config")
    if given is not None:
        return str(given)
    source = ctx.spec("model.name_or_path")
    if isinstance(source, str) and any(os.path.isfile(os.path.join(source, f)) for f in PROCESSOR_FILES):
        return source
    return None


def images(ctx: Resolver) -> None:
    vision = ctx.facts.vision
    for key in ("vision.image_size", "vision.train_tower", "vision.processor_config"):
        ctx.keep(key)
    if vision is None:
        ctx.keep("vision.images_per_example")  # "auto": none (plan.resolved.vision.images_per_example reads 0)
        user = [k for k in KEYS if ctx.is_user(k) and ctx.spec(k) not in (0, False)]
        if user:
            ctx.error(
                user[0],
                f"{user[0]} is set but model_type {ctx.facts.model_type!r} is not a vision-language model "
                f"(those gpuplan plans: {', '.join(VLM_FAMILIES)})",
                fix="remove [vision] from the spec, or point model.config at a vision-language model's config.json",
            )
        ctx.set_internal(IMAGE_PLAN, None)
        return
    per = ctx.spec("vision.images_per_example")
    if per == "auto":
        per = 1
        ctx.resolve("vision.images_per_example", 1, f"{vision.family} is a vision-language model: one image per example")
    size = ctx.spec("vision.image_size")
    if size is None:
        ctx.error(
            "vision.image_size",
            f"vision.image_size is not set: a {vision.family} model's tokens per image depend on the images' size",
            fix="set vision.image_size = 1024 (the pixel side of your images), or [width, height]",
        )
        ctx.set_internal(IMAGE_PLAN, None)
        return
    width, height = (size, size) if isinstance(size, int) else (size[0], size[1])
    path = _processor_path(ctx)
    try:
        tokens = image_tokens(vision, width, height, processor_config(path))
    except ModelConfigError as e:
        ctx.error(
            "vision.processor_config" if path else "vision.image_size", str(e), fix="fix the processor config, or plan another family"
        )
        ctx.set_internal(IMAGE_PLAN, None)
        return
    plan = ImagePlan(vision, width, height, per, bool(ctx.spec("vision.train_tower")), tokens, path)
    seq_len = ctx.spec("data.seq_len")
    if plan.tokens_per_example >= seq_len:
        need = (plan.tokens_per_example + 256 + 255) // 256 * 256
        ctx.error(
            "data.seq_len",
            f"data.seq_len = {seq_len} cannot hold the images: {per} x {tokens.tokens:,} image tokens "
            f"({width}x{height} px: {tokens.how}) = {plan.tokens_per_example:,} per example",
            fix=f"set data.seq_len = {need} (or more), or a smaller vision.image_size",
        )
    ctx.set_internal(IMAGE_PLAN, plan)


RULES = (
    Rule(
        "vision.images",
        reads=(*(f"spec:{k}" for k in KEYS), "spec:data.seq_len", "spec:model.name_or_path"),
        writes=(*KEYS, IMAGE_PLAN),
        apply=images,
        doc="a VLM's images in tokens (from the processor's config) within data.seq_len; [vision] on a text model is refused.",
    ),
)
