"""Build the real transformers model, its inputs and its optimizer under FakeTensorMode.

Everything here runs inside an active FakeTensorMode: no parameter or activation
memory is allocated. The model is built on the CPU device: a CPU build of torch
cannot run autograd on fake "cuda" tensors (c10 has no CUDA device guard; tried,
it aborts in torch::autograd::InputMetadata), so the CUDA choices that matter for
memory are made explicitly instead (see `optimizer_for` and trace/__init__.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.methods import method_of

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
}


def build_config(config: Mapping[str, Any], wl: Workload):
    from transformers import AutoConfig

    d = dict(config)
    model_type = d.pop("model_type", None)
    if model_type is None:
        raise ValueError("model config has no 'model_type': pass the model's config.json as a dict")
    d.pop("architectures", None)
    d.pop("transformers_version", None)
    d.pop("torch_dtype", None)
    d.pop("dtype", None)
    try:
        cfg = AutoConfig.for_model(model_type, **d)
    except ValueError as e:
        raise ValueError(
            f"model_type {model_type!r} is not one this transformers knows ({e}); trace a config whose model_type transformers supports"
        ) from e
    if wl.task == "seq-cls":
        cfg.num_labels = wl.num_labels
        if getattr(cfg, "pad_token_id", None) is None:
            cfg.pad_token_id = 0  # sequence classification of decoder models needs one
    attn = wl.attn_implementation
    if attn == "flash_attention_2":
        attn = "sdpa"  # same memory shape: output + log-sum-exp per row; the package is CUDA-only
    cfg._attn_implementation = attn
    cfg.use_cache = False  # the Trainer trains without the KV cache
    return cfg


def build_model(config: Mapping[str, Any], wl: Workload) -> torch.nn.Module:
    import transformers

    from gpuplan.modelinfo.vision_families import VLM_FAMILIES

    cfg = build_config(config, wl)
    vlm = VLM_FAMILIES.get(config["model_type"])
    auto = getattr(transformers, "AutoModelForImageTextToText" if vlm is not None else _AUTO_CLASSES[wl.task])
    # dtype at construction, as from_pretrained(dtype=...) loads it; .to() would try to
    # swap fake parameters in place, which torch refuses for tensor subclasses
    # qlora: the unquantized parts end in fp32 whatever the load dtype (trace/adapters.py)
    dtype = TORCH_DTYPES["float32" if method_of(wl.adapters).quantized_base else wl.weight_dtype]
    try:
        model = auto.from_config(cfg, dtype=dtype)
    except ValueError as e:
        if "attention implementation" not in str(e) or cfg._attn_implementation == "eager":
            raise
        # this architecture has no SDPA path in transformers: it runs eager attention
        cfg._attn_implementation = "eager"
        model = auto.from_config(cfg, dtype=dtype)
        model._gpuplan_note = f"{cfg.model_type} has no SDPA attention in this transformers: traced with eager"
    model.train()
    if vlm is not None and not wl.train_tower and wl.adapters is None:
        # full fine-tuning with the tower frozen, as apply freezes it (plan/vision_settings.py frozen_modules)
        for name, p in model.named_parameters():
            if any(name == t or name.startswith(t + ".") for t in vlm.tower):
                p.requires_grad_(False)
    if wl.gradient_checkpointing:
        # as the Trainer does (transformers 5.24 trainer.py: activation_checkpointing_enable,
        # whose default kwargs are {"use_reentrant": False}); older releases: the same via
        # gradient_checkpointing_enable
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if wl.adapters is not None:
        from gpuplan.trace.adapters import apply_adapters

        model = apply_adapters(model, wl)
    if wl.loss_chunk_size and wl.task == "causal-lm":
        from gpuplan.apply.model.chunked_loss import install

        install(model, wl.loss_chunk_size)  # as apply runs it: the trace sees one chunk's logits at a time
    return model


def make_vlm_batch(model: torch.nn.Module, wl: Workload) -> dict[str, torch.Tensor]:
    """One micro-batch of a vision-language model as its processor lays it out: each example's
    `images_per_example` images as `image_tokens` placeholder ids (of the config's image token)
    at the start of its text, and their pixels. Idefics3 / SmolVLM: pixel_values (b, images,
    3, side, side) of the tower's image size (one tile per image, do_image_splitting off).
    Qwen2-VL / Qwen2.5-VL: `_qwen_vl_batch`."""
    cfg: Any = model.config
    family = cfg.model_type
    if family in ("qwen2_vl", "qwen2_5_vl"):
        return _qwen_vl_batch(cfg, wl)
    if family == "mllama":
        return _mllama_batch(cfg, wl)
    if family not in ("idefics3", "smolvlm"):
        raise ValueError(f"the trace builds {family} batches only for idefics3 / smolvlm / qwen2_vl / qwen2_5_vl / mllama")
    b, s = wl.per_device_batch, wl.seq_len
    vocab = cfg.get_text_config().vocab_size
    ids = torch.randint(0, min(vocab, cfg.image_token_id), (b, s))
    n = wl.images_per_example * wl.image_tokens
    ids[:, :n] = cfg.image_token_id
    labels = ids.clone()
    labels[:, :n] = -100  # the collator masks the image tokens out of the labels
    side = cfg.vision_config.image_size
    pixels = torch.rand(b, wl.images_per_example, 3, side, side) + 0.5  # no all-zero (padding) image
    return {"input_ids": ids, "labels": labels, "pixel_values": pixels}


def _qwen_vl_batch(cfg: Any, wl: Workload) -> dict[str, torch.Tensor]:
    """Qwen2-VL's layout (processing_qwen2_vl.py, image_processing_qwen2_vl.py): each image a square
    grid of `tower_tokens` patches, its pixels flattened to one row per patch (3 x temporal x patch x
    patch values) in pixel_values, its (1, grid, grid) in image_grid_thw, and in the text
    <|vision_start|> + grid^2 / merge^2 image tokens + <|vision_end|> (wl.image_tokens, markers
    included); mm_token_type_ids marks the image tokens (1), which get_rope_index needs for the 3-D rope."""
    vc = cfg.vision_config
    merge, patch, temporal = vc.spatial_merge_size, vc.patch_size, vc.temporal_patch_size
    grid = int(round(wl.tower_tokens**0.5))
    placeholders = grid * grid // merge**2
    if grid * grid != wl.tower_tokens or grid % merge or wl.image_tokens != placeholders + 2:
        raise ValueError(
            f"a traced {cfg.model_type} image is a square grid of patches, a multiple of {merge} a side: "
            f"tower_tokens {wl.tower_tokens} with image_tokens {wl.image_tokens} (want grid^2 and grid^2 / {merge**2} + 2)"
        )
    b, s, k = wl.per_device_batch, wl.seq_len, wl.images_per_example
    specials = (cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id)
    ids = torch.randint(0, min(cfg.get_text_config().vocab_size, *specials), (b, s))
    for i in range(k):
        at = i * wl.image_tokens
        ids[:, at] = cfg.vision_start_token_id
        ids[:, at + 1 : at + 1 + placeholders] = cfg.image_token_id
        ids[:, at + 1 + placeholders] = cfg.vision_end_token_id
    labels = ids.clone()
    labels[:, : k * wl.image_tokens] = -100  # the collator masks the image and vision markers out of the labels
    types = (ids == cfg.image_token_id).int()
    pixels = torch.rand(b * k * grid * grid, 3 * temporal * patch * patch)
    thw = torch.tensor([[1, grid, grid]] * (b * k))
    return {"input_ids": ids, "labels": labels, "pixel_values": pixels, "image_grid_thw": thw, "mm_token_type_ids": types}


def _mllama_batch(cfg: Any, wl: Workload) -> dict[str, torch.Tensor]:
    """Llama 3.2 Vision's layout (processing_mllama.py, image_processing_mllama.py): one <|image|>
    token per image in the text, every image padded to `tower_images` (max_image_tiles) tiles of the
    tower's image size, all of them attended (aspect_ratio_mask and cross_attention_mask all ones,
    aspect ratio id 1), the text cross-attending to every image from the start."""
    b, s, k, tiles = wl.per_device_batch, wl.seq_len, wl.images_per_example, max(wl.tower_images, 1)
    side = cfg.vision_config.image_size
    ids = torch.randint(0, min(cfg.get_text_config().vocab_size, cfg.image_token_index), (b, s))
    ids[:, :k] = cfg.image_token_index
    labels = ids.clone()
    labels[:, :k] = -100
    return {
        "input_ids": ids,
        "labels": labels,
        "pixel_values": torch.rand(b, k, tiles, 3, side, side),
        "aspect_ratio_ids": torch.ones(b, k, dtype=torch.long),
        "aspect_ratio_mask": torch.ones(b, k, tiles, dtype=torch.long),
        "cross_attention_mask": torch.ones(b, s, k, tiles, dtype=torch.long),
    }


def make_batch(wl: Workload, vocab_size: int) -> dict[str, torch.Tensor]:
    """One micro-batch as a data collator yields it (no padding: every token is real).

    Packed (wl.packed): position ids as apply/data/examples.py lays them out (restarting per example;
    their values are fake, the mask builder sees a packed batch: trace/__init__ _unpacked_sequences)."""
    b, s = wl.per_device_batch, wl.seq_len
    ids = torch.randint(0, max(vocab_size, 2), (b, s))
    if wl.task == "seq-cls":
        labels = torch.randint(0, max(wl.num_labels, 2), (b,))
    else:
        labels = ids.clone()
    batch = {"input_ids": ids, "labels": labels}
    if wl.packed:
        batch["position_ids"] = torch.arange(s).repeat(b, 1)
    return batch


def optimizer_for(model: torch.nn.Module, wl: Workload, cuda: bool = True) -> tuple[torch.optim.Optimizer, str | None]:
    """The optimizer the Trainer builds for wl.optim (trainer.py create_optimizer)."""
    from transformers import Trainer, TrainingArguments
    from transformers.training_args import OptimizerNames

    note = None
    optim = wl.optim
    if optim not in {o.value for o in OptimizerNames}:
        note = f"optimizer {optim!r} is not a transformers OptimizerNames value; traced as adamw_torch"
        optim = "adamw_torch"
    args = TrainingArguments(output_dir="/tmp/gpuplan-trace", optim=optim, use_cpu=True, report_to=[])
    try:
        # transformers annotates PreTrainedModel; the Trainer itself passes its model, a PeftModel too
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)  # type: ignore[arg-type]
    except (ImportError, ValueError) as e:
        note = f"optimizer {optim!r} unavailable here ({e}); traced as adamw_torch"
        args = TrainingArguments(output_dir="/tmp/gpuplan-trace", optim="adamw_torch", use_cpu=True, report_to=[])
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)  # type: ignore[arg-type]  # as above
    # the Trainer's own rule for which parameters decay; the method reads nothing of its Trainer
    decay = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    kwargs = dict(kwargs)
    if cuda and cls is torch.optim.AdamW and not kwargs.get("fused"):
        # On CUDA torch picks the foreach implementation by default
        # (torch/optim/optimizer.py _default_to_fused_or_foreach); on CPU it would not.
        kwargs["foreach"] = True
    if cls.__module__.startswith("bitsandbytes"):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        if kwargs.get("optim_bits") == 8:
            # As the Trainer does (trainer.py create_optimizer): embeddings keep 32-bit
            # states. The manager is process-global: start it clean so overrides left by
            # earlier optimizers in this process cannot leak into this one.
            import bitsandbytes

            manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
            manager.initialize()
            for module in model.modules():
                if isinstance(module, torch.nn.Embedding):
                    manager.register_module_override(module, "weight", {"optim_bits": 32})

        # its constructor builds the 256-entry quantization maps from data (.tolist()),
        # which fake tensors cannot do: build it for real (2 KiB), trace the rest
        with unset_fake_temporarily():
            return _no_kernel(cls)(groups, **kwargs), note
    return cls(groups, **kwargs), note


def _no_kernel(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """A bitsandbytes optimizer whose states are built by its own init_state (the real
    layout: uint8 states, fp32 absmax per 256 values, fp32 below min_8bit_size) but whose
    CUDA update kernel is not run: it updates in place and allocates nothing."""

    def update_step(self: Any, group: Any, p: Any, gindex: int, pindex: int) -> None:
        return None

    return type(f"{cls.__name__}NoKernel", (cls,), {"update_step": update_step})
