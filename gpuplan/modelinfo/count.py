"""model_facts: shapes and counts of a model for a task, from its config."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.modelinfo.params import Dims, ParamList
from gpuplan.modelinfo.registry import FAMILIES, TASKS, known_model_types, unsupported_task
from gpuplan.modelinfo.vision_families import ANALYTIC as VLM_ANALYTIC
from gpuplan.modelinfo.vision_families import VLM_FAMILIES


def check_request(config: Mapping[str, Any], task: str, num_labels: int) -> str:
    """Validate the arguments common to both counting paths; return model_type."""
    if not isinstance(config, Mapping):
        raise ModelConfigError(None, f"model config must be a mapping, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelConfigError(
            None,
            f"model config is missing the required field 'model_type' (got {model_type!r}); "
            'add it as in a transformers config.json, e.g. "model_type": "llama"',
        )
    if task not in TASKS:
        raise ModelConfigError(None, f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
        raise ModelConfigError(None, f"num_labels = {num_labels!r} is invalid: expected an integer >= 1")
    return model_type


def model_facts(config: Mapping[str, Any], task: str = "causal-lm", num_labels: int = 2, *, allow_meta_fallback: bool = True) -> ModelFacts:
    """Parameter count, tensor shapes and architecture facts of `config` for `task`.

    Known families (known_model_types()) are counted analytically without
    importing torch; n_params equals sum(p.numel() for p in model.parameters())
    of the transformers model for the task, tied weights counted once. Other
    model_types are built on the meta device (imports torch and transformers)
    unless allow_meta_fallback is False.
    """
    model_type = check_request(config, task, num_labels)
    if model_type in VLM_FAMILIES:
        return _vlm_facts(model_type, config, task, allow_meta_fallback)
    family = FAMILIES.get(model_type)
    if family is None:
        if not allow_meta_fallback:
            raise ModelConfigError(
                None,
                f"model_type {model_type!r} has no analytic parameter count (known: "
                f"{', '.join(known_model_types())}); allow the meta-device fallback, which "
                "imports torch and transformers, or use one of the known architectures",
            )
        from gpuplan.modelinfo.meta import meta_facts

        return meta_facts(config, task, num_labels)
    counter, supported = family
    if task not in supported:
        raise unsupported_task(model_type, task, supported)
    params, dims = counter(model_type, config, task, num_labels)
    return facts_from_params(model_type, config, task, params, dims)


def _vlm_facts(model_type: str, config: Mapping[str, Any], task: str, allow_meta_fallback: bool) -> ModelFacts:
    """A vision-language model: its next-token loss is the language model's (task causal-lm);
    apply builds it with AutoModelForImageTextToText."""
    if task != "causal-lm":
        raise ModelConfigError(
            None,
            f"task {task!r} is not supported for the vision-language model_type {model_type!r}: "
            "gpuplan fine-tunes it as image-text-to-text with the language model's next-token loss; "
            'set model.task = "causal-lm"',
        )
    counter = VLM_ANALYTIC.get(model_type)
    if counter is None:
        if not allow_meta_fallback:
            raise ModelConfigError(
                None,
                f"the vision-language model_type {model_type!r} has no analytic parameter count (analytic: "
                f"{', '.join(sorted(VLM_ANALYTIC))}); allow the meta-device fallback, which imports torch and transformers",
            )
        from gpuplan.modelinfo.meta import meta_facts

        return meta_facts(config, task, 2)
    params, dims, vision = counter(model_type, config, task, 2)
    return dataclasses.replace(facts_from_params(model_type, config, task, params, dims), vision=vision)


def facts_from_params(model_type: str, config: Mapping[str, Any], task: str, params: ParamList, dims: Dims) -> ModelFacts:
    """ModelFacts of a model whose parameter tensors a family counter listed (`params`) with its dims."""
    notes = list(params.notes)
    if "tie_word_embeddings" not in config:
        notes.append(f"tie_word_embeddings absent: the {model_type} default ({str(dims.tie_word_embeddings).lower()}) applies")
    if dims.tie_word_embeddings and task != "seq-cls":
        notes.append("output projection tied to the input embeddings: counted once")
    return ModelFacts(
        model_type=model_type,
        task=task,
        n_params=params.total(),
        param_shapes=tuple(params.items),
        linear_layers=tuple(params.layers),
        hidden_size=dims.hidden_size,
        num_layers=dims.num_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_key_value_heads,
        head_dim=dims.head_dim,
        intermediate_size=dims.intermediate_size,
        vocab_size=dims.vocab_size,
        max_position_embeddings=dims.max_position_embeddings,
        mlp=dims.mlp,
        norm=dims.norm,
        tie_word_embeddings=dims.tie_word_embeddings,
        hidden_dropout=dims.hidden_dropout,
        attention_dropout=dims.attention_dropout,
        source="analytic",
        notes=tuple(notes),
        num_experts=params.experts.get("num_experts", 0),
        experts_per_token=params.experts.get("experts_per_token", 0),
    )
