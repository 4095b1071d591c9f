"""Fallback for architectures without an analytic counter: build on the meta device.

This is the only module of gpuplan.modelinfo that imports torch and
transformers, and only inside meta_facts(). The model is instantiated under
torch.device("meta") (no memory, no weights), as accelerate's
`estimate-memory` does with init_empty_weights, and its named_parameters()
are read. trust_remote_code is never enabled.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any

from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.facts import ModelFacts, VisionFacts
from gpuplan.modelinfo.registry import TASKS, known_model_types, unsupported_task
from gpuplan.modelinfo.vision_families import VLM_FAMILIES, split_params

# Config attribute names different families use for the same fact, first match wins.
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim", "word_embed_proj_dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "head_dim": ("head_dim", "kv_channels"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size", "inner_hidden_size", "hidden_dim"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"),
    "hidden_dropout": ("hidden_dropout", "hidden_dropout_prob", "resid_pdrop", "dropout"),
    "attention_dropout": ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop"),
}


def _first(cfg: Any, fact: str) -> Any:
    for name in _ALIASES[fact]:
        value = getattr(cfg, name, None)
        if value is not None and not isinstance(value, bool):
            return value
    return None


def _unknown_type_error(model_type: str, transformers_types: list[str]) -> ModelConfigError:
    known = known_model_types()
    others = sorted(set(transformers_types) - set(known))
    close = difflib.get_close_matches(model_type, list(known) + others, n=3, cutoff=0.6)
    hint = f"Did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return ModelConfigError(
        None,
        f"unknown model_type {model_type!r}: neither gpuplan nor transformers knows it. {hint}"
        f"Counted without torch: {', '.join(known)}; transformers knows {len(others)} "
        'more (counted on the meta device). Fix the "model_type" field of config.json.',
    )


def _build(model_type: str, config: Mapping[str, Any], task: str, num_labels: int) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # from_config never needs the hub
    try:
        import torch
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError as exc:
        raise ModelConfigError(
            None,
            f"model_type {model_type!r} has no analytic count and counting it on the meta "
            f"device needs torch and transformers ({exc}); install them: pip install 'gpuplan[train]'",
        ) from None
    if model_type not in CONFIG_MAPPING:
        raise _unknown_type_error(model_type, sorted(CONFIG_MAPPING.keys()))
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    verbosity = transformers.logging.get_verbosity()
    # config-range and "add is_decoder=True" advice is noise when only counting
    transformers.logging.set_verbosity_error()
    try:
        return _instantiate(transformers, torch, model_type, kwargs, task, num_labels)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _instantiate(transformers: Any, torch: Any, model_type: str, kwargs: dict[str, Any], task: str, num_labels: int) -> Any:
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **kwargs)
    except Exception as exc:  # strict config validation raises several types
        raise ModelConfigError(None, f"transformers rejects this {model_type} config: {exc}") from None
    if task == "seq-cls":
        hf_config.num_labels = num_labels
    # a vision-language model is fine-tuned whole (tower, projector, language model)
    auto_cls = getattr(transformers, "AutoModelForImageTextToText" if model_type in VLM_FAMILIES else TASKS[task])
    try:
        with torch.device("meta"):
            return auto_cls.from_config(hf_config, trust_remote_code=False)
    except ValueError as exc:
        if "Unrecognized configuration class" in str(exc):
            raise unsupported_task(model_type, task, _supported_tasks(model_type)) from None
        raise ModelConfigError(None, f"transformers cannot build this {model_type} config: {exc}") from None


def _supported_tasks(model_type: str) -> tuple[str, ...]:
    from transformers.models.auto import modeling_auto as auto

    mappings = {
        "causal-lm": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "seq-cls": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "masked-lm": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    }
    return tuple(task for task, names in mappings.items() if model_type in names) or ("none",)


def meta_facts(config: Mapping[str, Any], task: str, num_labels: int) -> ModelFacts:
    """ModelFacts for any model_type transformers knows, by meta-device instantiation."""
    model_type = config["model_type"]
    model = _build(model_type, config, task, num_labels)
    shapes = tuple((name, tuple(p.shape)) for name, p in model.named_parameters())
    cfg = model.config.get_text_config()
    notes = [f"unknown architecture {model_type}: counted by instantiating on the meta device (imports torch)"]

    inp = model.get_input_embeddings()
    hidden = _first(cfg, "hidden_size")
    if hidden is None:
        hidden = inp.weight.shape[1]
        notes.append("hidden_size read from the input embedding width")
    heads = _first(cfg, "num_attention_heads")
    if heads is None:
        heads = 1
        notes.append("num_attention_heads not in the config: assumed 1")
    kv = _first(cfg, "num_key_value_heads") or heads
    if getattr(cfg, "multi_query", False) and not getattr(cfg, "new_decoder_architecture", False):
        kv = 1  # multi-query attention (Falcon-7B, GPTBigCode/StarCoder)
    intermediate = _first(cfg, "intermediate_size")
    if intermediate is None:
        intermediate = 4 * hidden
        notes.append("intermediate_size not in the config: assumed 4 x hidden_size")
    layers = _first(cfg, "num_layers")
    if layers is None:
        found = (re.search(r"\.(?:layers?|h|blocks)\.(\d+)\.", n) for n, _ in shapes)
        layers = len({m.group(1) for m in found if m})
        notes.append("num_layers counted from parameter names")
    vocab = _first(cfg, "vocab_size")
    if vocab is None:
        vocab = inp.weight.shape[0]
        notes.append("vocab_size read from the input embedding rows")
    names = " ".join(name for name, _ in shapes)
    gated = any(k in names for k in ("gate_proj", "gate_up_proj", "w1.", "w3."))
    module_types = {type(m).__name__ for m in model.modules()}
    rms = any("RMSNorm" in t for t in module_types)
    out = model.get_output_embeddings()
    tied = out is not None and inp is not None and out.weight is inp.weight
    notes.append("mlp and norm kinds inferred from module and parameter names")
    linear = _linear_layers(model, out)
    return ModelFacts(
        model_type=model_type,
        task=task,
        n_params=sum(p.numel() for p in model.parameters()),
        param_shapes=shapes,
        hidden_size=int(hidden),
        num_layers=int(layers),
        num_attention_heads=int(heads),
        num_key_value_heads=int(kv),
        head_dim=int(_first(cfg, "head_dim") or hidden // heads),
        intermediate_size=int(intermediate),
        vocab_size=int(vocab),
        max_position_embeddings=_first(cfg, "max_position_embeddings"),
        mlp="gated" if gated else "plain",
        norm="rmsnorm" if rms else "layernorm",
        tie_word_embeddings=tied,
        hidden_dropout=float(_first(cfg, "hidden_dropout") or 0.0),
        attention_dropout=float(_first(cfg, "attention_dropout") or 0.0),
        source="meta-device",
        notes=tuple(notes),
        linear_layers=linear,
        vision=_vision(model_type, model, shapes) if model_type in VLM_FAMILIES else None,
    )


# config keys of the image-token geometry, where a family has them (modelinfo/image_tokens.py)
_GEOMETRY_TOP = ("scale_factor", "mm_tokens_per_image", "vision_feature_select_strategy", "image_grid_pinpoints")
_GEOMETRY_VISION = ("image_size", "max_num_tiles", "spatial_merge_size", "temporal_patch_size")


def _vision(model_type: str, model: Any, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> VisionFacts:
    """The tower / projector / language model split of a meta-built VLM, and its tower's dims."""
    fam = VLM_FAMILIES[model_type]
    tower, projector, lm = split_params(model_type, shapes)
    vc: Any = model.config.vision_config
    width: Any = vc.hidden_size if model_type != "qwen2_vl" else vc.embed_dim
    heads: Any = getattr(vc, "num_attention_heads", None) or getattr(vc, "attention_heads", None)
    inter: Any = getattr(vc, "intermediate_size", None) or int(width) * int(getattr(vc, "mlp_ratio", 4))
    layers: Any = vc.num_hidden_layers
    if model_type == "mllama":  # MllamaVisionModel: a local transformer, then a global one
        layers = vc.num_hidden_layers + vc.num_global_layers
    gated = any(k in n for n, _ in shapes if n.startswith(fam.tower[0]) for k in ("gate_proj",))
    patch = vc.patch_size if isinstance(vc.patch_size, int) else vc.patch_size[0]
    geometry = [(k, _plain(getattr(model.config, k))) for k in _GEOMETRY_TOP if getattr(model.config, k, None) is not None]
    geometry += [(k, _plain(getattr(vc, k))) for k in _GEOMETRY_VISION if getattr(vc, k, None) is not None]
    if model_type == "mllama":  # MllamaTextModel: cross-attention layers over the projected tower output
        tc: Any = model.config.text_config
        geometry += [("cross_attention_layers", len(tc.cross_attention_layers)), ("vision_output_dim", int(vc.vision_output_dim))]
    token_id = getattr(model.config, fam.image_token_key, None)
    return VisionFacts(
        family=model_type,
        tower_modules=fam.tower,
        projector_modules=fam.projector,
        language_model_modules=fam.language_model,
        tower_params=tower,
        projector_params=projector,
        language_model_params=lm,
        hidden_size=int(width),
        num_layers=int(layers),
        num_attention_heads=int(heads),
        intermediate_size=int(inter),
        mlp="gated" if gated else "plain",
        patch_size=int(patch),
        image_token_id=int(token_id) if token_id is not None else None,
        geometry=tuple(geometry),
    )


def _plain(v: Any) -> Any:
    """A config value as hashable plain data (lists of lists -> tuples)."""
    if isinstance(v, list | tuple):
        return tuple(_plain(x) for x in v)
    return v


def _linear_layers(model: Any, output_embeddings: Any) -> tuple[tuple[str, str, int, int], ...]:
    """nn.Linear and Conv1D modules but the output embedding (the analytic families leave the
    head out too: peft's "all-linear" excludes it, tuners_utils._maybe_include_all_linear_layers)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    out = []
    for name, m in model.named_modules():
        if m is output_embeddings:
            continue
        if isinstance(m, torch.nn.Linear):
            out.append((name, "linear", m.in_features, m.out_features))
        elif isinstance(m, Conv1D):
            out.append((name, "conv1d", m.weight.shape[0], m.nf))
    return tuple(out)
