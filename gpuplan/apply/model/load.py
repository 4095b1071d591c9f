"""Load the model to fine-tune, or build it from a config to train from scratch.

Reads only plan values: model.config, model.name_or_path, model.from_scratch,
model.task, model.num_labels, model.dtype (through convert.torch_dtype),
model.attn_implementation, model.trust_remote_code, model.allow_pickle_weights, and for
model.method = "qlora" the 4-bit settings (quant4_load.load_kwargs).
Nothing is fetched from the Hub here: a Hub id's files were downloaded at the start of
apply (gpuplan/hub/fetch.py) and load from the cache with `local_files_only=True`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.model.quant4 import load_kwargs
from gpuplan.apply.train.arguments import refusal_fix, torch_dtype, uses_cpu
from gpuplan.hub.fetch import model_dir as hub_model_dir  # a HubError is a GpuplanError: the CLI reports it with its fix
from gpuplan.plan.types import Plan

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def auto_class(task: str, vision: bool = False) -> Any:
    """The transformers Auto class for `task`; a vision-language model's is AutoModelForImageTextToText."""
    import transformers

    if vision:
        return transformers.AutoModelForImageTextToText
    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "seq-cls": transformers.AutoModelForSequenceClassification,
        "masked-lm": transformers.AutoModelForMaskedLM,
    }[task]


def weight_files(model_dir: str) -> tuple[list[str], list[str]]:
    """(safetensors files, pickle-format files) in `model_dir`."""
    names = sorted(os.listdir(model_dir))
    safe = [n for n in names if n.endswith(".safetensors")]
    pickled = [n for n in names if n.endswith(_PICKLE_SUFFIXES) or n.endswith(".bin.index.json")]
    return safe, pickled


def read_config_dict(path: str, key: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ApplyError(f"{key}: {path} does not exist; point it at a config.json", key=key)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ApplyError(f"{key}: {path} is not readable JSON: {e}", key=key) from e
    if not isinstance(d, dict) or "model_type" not in d:
        raise ApplyError(f'{key}: {path} has no "model_type"; a transformers config.json names its architecture')
    return d


def build_config(plan: Plan, label_names: list[str] | None) -> Any:
    """The config for a model built from scratch (model.config, or the model dir's config.json)."""
    from transformers import AutoConfig

    path, key = plan.resolved.model.config, "model.config"
    if path is None:
        model_dir = hub_model_dir(plan.resolved.model.hub)
        if model_dir is None:
            raise ApplyError("model.from_scratch = true needs model.config or model.name_or_path (a config.json)", key="model.from_scratch")
        path, key = os.path.join(model_dir, "config.json"), "model.name_or_path"
    d = read_config_dict(path, key)
    model_type = d.pop("model_type")
    d.pop("transformers_version", None)
    try:
        config = AutoConfig.for_model(model_type, **d)
    except (KeyError, ValueError) as e:
        raise ApplyError(
            f"{key}: model_type {model_type!r} in {path} is not known to transformers: {e}", key=key, fix=_transformers_fix(plan, e)
        ) from e
    _set_labels(config, label_names)
    return config


def _set_labels(config: Any, label_names: list[str] | None) -> None:
    if label_names is None:
        return
    config.num_labels = len(label_names)
    config.id2label = {i: name for i, name in enumerate(label_names)}
    config.label2id = {name: i for i, name in enumerate(label_names)}


def load_model(plan: Plan, tokenizer: Any, label_names: list[str] | None = None) -> Any:
    """The model in `model.dtype` with `model.attn_implementation`, checked after loading."""
    m = plan.resolved.model
    task = m.task
    if task == "seq-cls":
        num_labels = m.num_labels  # None: as many as the training data has
        if label_names is None or (num_labels is not None and len(label_names) != num_labels):
            found = "none" if label_names is None else f"{len(label_names)} ({', '.join(label_names)})"
            raise ApplyError(
                f"model.num_labels = {num_labels} but the training data has {found} distinct labels; "
                f"set model.num_labels = {len(label_names or [])} or fix data.label_field"
            )
    else:
        label_names = None
    from gpuplan.apply.model.vision import freeze, frozen_prefixes, is_vision_language

    vision = is_vision_language(plan)
    cls = auto_class(task, vision)
    common = {
        "attn_implementation": m.attn_implementation,
        "dtype": torch_dtype(plan),
        "trust_remote_code": m.trust_remote_code,
    }
    try:
        if m.from_scratch:
            config = build_config(plan, label_names)
            _check_vocab(plan, getattr(config, "vocab_size", None), tokenizer)  # before padding_idx asserts
            model = cls.from_config(config, **common)
        else:
            model = _from_pretrained(plan, cls, label_names, common)
    except (ValueError, ImportError) as e:  # unsupported attention kernel, missing package, bad config
        raise ApplyError(f"cannot build the {task} model: {e}", fix=_transformers_fix(plan, e)) from e
    _check_loaded(plan, model, tokenizer)
    if vision:  # the vision tower frozen unless the plan trains it (model/vision.py)
        freeze(model, frozen_prefixes(plan))
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        # Sequence classification pools the last non-pad token and needs the pad id to find it.
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def _from_pretrained(plan: Plan, cls: Any, label_names: list[str] | None, common: Mapping[str, Any]) -> Any:
    model_dir = hub_model_dir(plan.resolved.model.hub)
    if model_dir is None:
        raise ApplyError("model.name_or_path is not set: fine-tuning needs a local model directory", key="model.name_or_path")
    if not os.path.isdir(model_dir):
        raise ApplyError(f"model.name_or_path: {model_dir} is not a directory (config.json + *.safetensors)", key="model.name_or_path")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ApplyError(f"model.name_or_path: {model_dir} has no config.json", key="model.name_or_path")
    safe, pickled = weight_files(model_dir)
    allow_pickle = plan.resolved.model.allow_pickle_weights
    if not safe and not pickled:
        raise ApplyError(
            f"model.name_or_path: {model_dir} holds no weights (*.safetensors); set model.from_scratch = true to train from its config.json"
        )
    if not safe and not allow_pickle:
        raise ApplyError(
            f"model.name_or_path: {model_dir} holds weights only in pickle format ({', '.join(pickled)}), "
            "which can run arbitrary code when loaded. Convert them to safetensors, or set "
            "model.allow_pickle_weights = true if you trust their source"
        )
    kwargs: dict[str, Any] = dict(common, local_files_only=True, use_safetensors=bool(safe))
    kwargs.update(load_kwargs(plan, "cpu" if uses_cpu(plan) else "cuda", cls))  # qlora: the 4-bit base
    if not safe:
        kwargs["weights_only"] = False  # allowed explicitly by model.allow_pickle_weights
    if label_names is not None:
        kwargs.update(
            num_labels=len(label_names),
            id2label={i: n for i, n in enumerate(label_names)},
            label2id={n: i for i, n in enumerate(label_names)},
        )
    try:
        return cls.from_pretrained(model_dir, **kwargs)
    except OSError as e:  # missing or truncated weight files, a config the weights do not match
        raise ApplyError(
            f"model.name_or_path: cannot load {model_dir}: {e}",
            key="model.name_or_path",
            fix="check that the directory holds a complete model (config.json and every weight file "
            "its index lists), or set model.from_scratch = true to train from its config",
        ) from e


def _check_loaded(plan: Plan, model: Any, tokenizer: Any) -> None:
    planned = plan.resolved.model.attn_implementation
    actual = getattr(model.config, "_attn_implementation", None)
    if actual != planned:
        raise ApplyError(
            f"model.attn_implementation = {planned!r} but the model loaded with {actual!r}; "
            'set it to one the architecture supports ("sdpa" or "eager")'
        )
    _check_vocab(plan, getattr(model.config, "vocab_size", None) or model.get_input_embeddings().num_embeddings, tokenizer)


def _check_vocab(plan: Plan, vocab: int | None, tokenizer: Any) -> None:
    if vocab is not None and len(tokenizer) > vocab:
        raise ApplyError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab}; "
            f'set "vocab_size": {len(tokenizer)} (or more) in the model config'
            + (
                " (masked-lm with the byte-level tokenizer needs 261: 256 bytes, 4 specials, <mask>)"
                if plan.resolved.model.task == "masked-lm"
                else ""
            )
        )


def _transformers_fix(plan: Plan, error: BaseException) -> str:
    import transformers

    return refusal_fix(plan, "transformers", transformers.__version__, error)
