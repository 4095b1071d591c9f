"""Vision-language models: which model_types are ones, how their parameters split, their counts.

A VLM is recognised by config.json's model_type, as transformers 5.24 names the families with an
AutoModelForImageTextToText class (transformers/models/auto/modeling_auto.py
MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES). Its parameters split by module-name prefix into the
vision tower, the projector (the layers that map the tower's features to the language model's
width) and the language model, as <F>ForConditionalGeneration.named_parameters() names them.

Qwen2-VL and Qwen2.5-VL are counted analytically here, without torch, from
modeling_qwen2_vl.py / modeling_qwen2_5_vl.py (PatchEmbed, <F>VisionBlock, PatchMerger,
<F>TextModel, <F>ForConditionalGeneration); the other families are built on the meta device
(modelinfo/meta.py) and split by the same prefixes. tests/modelinfo/test_vision_counts.py checks
both against transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

from gpuplan.modelinfo.defaults import FamilyConfig
from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.facts import VisionFacts
from gpuplan.modelinfo.params import Dims, ParamList


@dataclass(frozen=True)
class VisionFamily:
    """Where a family's tower, projector and language model live (module-name prefixes)."""

    tower: tuple[str, ...]
    projector: tuple[str, ...]
    language_model: tuple[str, ...]
    image_token_key: str  # the config key of the image placeholder token's id


_LLAVA = VisionFamily(("model.vision_tower",), ("model.multi_modal_projector",), ("model.language_model", "lm_head"), "image_token_index")
VLM_FAMILIES: dict[str, VisionFamily] = {
    "qwen2_vl": VisionFamily(
        ("model.visual.patch_embed", "model.visual.blocks"), ("model.visual.merger",), ("model.language_model", "lm_head"), "image_token_id"
    ),
    "qwen2_5_vl": VisionFamily(
        ("model.visual.patch_embed", "model.visual.blocks"), ("model.visual.merger",), ("model.language_model", "lm_head"), "image_token_id"
    ),
    "mllama": VisionFamily(
        ("model.vision_model",), ("model.multi_modal_projector",), ("model.language_model", "lm_head"), "image_token_index"
    ),
    "gemma3": VisionFamily(
        ("model.vision_tower",), ("model.multi_modal_projector",), ("model.language_model", "lm_head"), "image_token_index"
    ),
    "idefics3": VisionFamily(("model.vision_model",), ("model.connector",), ("model.text_model", "lm_head"), "image_token_id"),
    "smolvlm": VisionFamily(("model.vision_model",), ("model.connector",), ("model.text_model", "lm_head"), "image_token_id"),
    "llava": _LLAVA,
    "llava_next": VisionFamily(
        ("model.vision_tower",),
        ("model.multi_modal_projector", "model.image_newline"),
        ("model.language_model", "lm_head"),
        "image_token_index",
    ),
}


def is_vlm(model_type: str) -> bool:
    return model_type in VLM_FAMILIES


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def split_params(model_type: str, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[int, int, int]:
    """(tower, projector, language model) parameters of named_parameters() shapes; every
    parameter must fall in one group (an unplaced one means the prefixes are out of date)."""
    fam = VLM_FAMILIES[model_type]
    tower = projector = lm = 0
    for name, shape in shapes:
        n = prod(shape) if shape else 1
        if _under(name, fam.projector):
            projector += n
        elif _under(name, fam.tower):
            tower += n
        elif _under(name, fam.language_model):
            lm += n
        else:
            raise ModelConfigError(None, f"{model_type}: parameter {name!r} is in none of the tower, projector or language model")
    return tower, projector, lm


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's keys: text_config (transformers 5 saves), else the top level
    (Hub configs saved before 5 keep them flat; <F>Config.__post_init__ moves them)."""
    sub = config.get("text_config")
    return sub if isinstance(sub, Mapping) else config


def vision_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    sub = config.get("vision_config")
    if sub is not None and not isinstance(sub, Mapping):
        raise ModelConfigError(None, f"{config['model_type']} config: vision_config must be an object, got {type(sub).__name__}")
    return sub or {}


def _tied(model_type: str, config: Mapping[str, Any]) -> bool:
    """The outer tie_word_embeddings, or the text config's (Qwen2VLConfig.__post_init__ BC)."""
    top = FamilyConfig(model_type, config).bool("tie_word_embeddings")
    inner = text_config(config).get("tie_word_embeddings")
    return top or inner is True


def _text_dims(text: FamilyConfig, tied: bool) -> Dims:
    hidden, heads = text.int("hidden_size"), text.int("num_attention_heads")
    if hidden % heads:
        raise ModelConfigError(
            None, f"{text.model_type} config: {text.shown('hidden_size')} is not divisible by {text.shown('num_attention_heads')}"
        )
    kv = text.int("num_key_value_heads")
    if heads % kv:
        raise ModelConfigError(
            None, f"{text.model_type} config: {text.shown('num_attention_heads')} is not divisible by {text.shown('num_key_value_heads')}"
        )
    return Dims(
        hidden_size=hidden,
        num_layers=text.int("num_hidden_layers", minimum=0),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hidden // heads,  # Qwen2VLAttention / Qwen2_5_VLAttention: hidden // heads, no head_dim key
        intermediate_size=text.int("intermediate_size"),
        vocab_size=text.int("vocab_size"),
        max_position_embeddings=text.int("max_position_embeddings"),
        mlp="gated",
        norm="rmsnorm",
        tie_word_embeddings=tied,
        hidden_dropout=0.0,
        attention_dropout=text.float("attention_dropout"),
    )


def _qwen_text(p: ParamList, d: Dims) -> None:
    """<F>TextModel under model.language_model: Qwen2 layers (q/k/v with bias, o without, gated
    MLP, two RMSNorms), then lm_head (untied unless tie_word_embeddings)."""
    lm = ParamList()
    h, hd = d.hidden_size, d.head_dim
    lm.embedding("model.embed_tokens", d.vocab_size, h)
    for n in range(d.num_layers):
        a, m = f"model.layers.{n}.self_attn", f"model.layers.{n}.mlp"
        lm.linear(f"{a}.q_proj", h, d.num_attention_heads * hd, True)
        lm.linear(f"{a}.k_proj", h, d.num_key_value_heads * hd, True)
        lm.linear(f"{a}.v_proj", h, d.num_key_value_heads * hd, True)
        lm.linear(f"{a}.o_proj", d.num_attention_heads * hd, h, False)
        lm.linear(f"{m}.gate_proj", h, d.intermediate_size, False)
        lm.linear(f"{m}.up_proj", h, d.intermediate_size, False)
        lm.linear(f"{m}.down_proj", d.intermediate_size, h, False)
        lm.norm(f"model.layers.{n}.input_layernorm", h, bias=False)
        lm.norm(f"model.layers.{n}.post_attention_layernorm", h, bias=False)
    lm.norm("model.norm", h, bias=False)
    p.extend_renamed(lm, "model.", "model.language_model.")
    if not d.tie_word_embeddings:
        p.add("lm_head.weight", d.vocab_size, h)


def count_qwen_vl(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> tuple[ParamList, Dims, VisionFacts]:
    """qwen2_vl, qwen2_5_vl: the vision transformer under model.visual (Conv3d patch embedding,
    blocks, the patch merger), the text model, the head."""
    top = FamilyConfig(model_type, config)
    text = FamilyConfig(f"{model_type}_text", text_config(config))
    vis = FamilyConfig(f"{model_type}_vision", vision_config(config))
    d = _text_dims(text, _tied(model_type, config))
    v25 = model_type == "qwen2_5_vl"
    width = vis.int("hidden_size") if v25 else vis.int("embed_dim")
    out = vis.int("out_hidden_size") if v25 else vis.int("hidden_size")
    inter = vis.int("intermediate_size") if v25 else width * vis.int("mlp_ratio")
    depth, heads = vis.int("depth", minimum=0), vis.int("num_heads")
    patch, temporal, merge = vis.int("patch_size"), vis.int("temporal_patch_size"), vis.int("spatial_merge_size")
    if width % heads:
        raise ModelConfigError(None, f"{model_type} vision_config: {vis.shown('num_heads')} does not divide the width {width}")
    p = ParamList()
    # PatchEmbed: Conv3d(in_channels, width, kernel (temporal, patch, patch), bias=False)
    p.add("model.visual.patch_embed.proj.weight", width, vis.int("in_channels"), temporal, patch, patch)
    for n in range(depth):
        b = f"model.visual.blocks.{n}"
        # Qwen2.5-VL: RMSNorm (weight), gated MLP with biases; Qwen2-VL: LayerNorm, fc1/fc2
        p.norm(f"{b}.norm1", width, bias=not v25)
        p.norm(f"{b}.norm2", width, bias=not v25)
        p.linear(f"{b}.attn.qkv", width, 3 * width, True)
        p.linear(f"{b}.attn.proj", width, width, True)
        if v25:
            p.linear(f"{b}.mlp.gate_proj", width, inter, True)
            p.linear(f"{b}.mlp.up_proj", width, inter, True)
            p.linear(f"{b}.mlp.down_proj", inter, width, True)
        else:
            p.linear(f"{b}.mlp.fc1", width, inter, True)
            p.linear(f"{b}.mlp.fc2", inter, width, True)
    # PatchMerger: norm over the width, then merge x merge patches -> Linear, GELU, Linear(-> out)
    merged = width * merge * merge
    p.norm("model.visual.merger.ln_q", width, bias=not v25)
    p.linear("model.visual.merger.mlp.0", merged, merged, True)
    p.linear("model.visual.merger.mlp.2", merged, out, True)
    _qwen_text(p, d)
    tower, projector, lm = split_params(model_type, tuple(p.items))
    fam = VLM_FAMILIES[model_type]
    vision = VisionFacts(
        family=model_type,
        tower_modules=fam.tower,
        projector_modules=fam.projector,
        language_model_modules=fam.language_model,
        tower_params=tower,
        projector_params=projector,
        language_model_params=lm,
        hidden_size=width,
        num_layers=depth,
        num_attention_heads=heads,
        intermediate_size=inter,
        mlp="gated" if v25 else "plain",
        patch_size=patch,
        image_token_id=top.int_or_none("image_token_id", minimum=0),
        geometry=(("merge_size", merge), ("temporal_patch_size", temporal)),
    )
    return p, d, vision


ANALYTIC = {"qwen2_vl": count_qwen_vl, "qwen2_5_vl": count_qwen_vl}
