"""LoRA and QLoRA: the planned LoraConfig on a frozen base, 16-bit or 4-bit.

Reads only plan values: model.method ("full" | "lora" | "qlora"; absent in plans made
before the method existed, which are "full"), model.task, model.from_scratch,
lora.r, lora.lora_alpha, lora.lora_dropout, lora.target_modules, lora.use_dora,
lora.modules_to_save, quantization.bnb_4bit_quant_type, quantization.bnb_4bit_use_double_quant,
quantization.bnb_4bit_compute_dtype, training.gradient_checkpointing, output.merge_adapter.

What the libraries do, as installed (peft 0.21, transformers 5.24, bitsandbytes 0.50):
- The 4-bit base loads in the compute dtype (load_kwargs), then `prepare_model_for_kbit_training`
  (peft utils/other.py) freezes every base parameter and casts every fp16/bf16 parameter that
  is not a Params4bit to fp32: embeddings, norms and an untied head are fp32 in a QLoRA run.
- A 4-bit model is never moved by the Trainer (trainer.py: place_model_on_device is off
  for bitsandbytes models), so on CUDA it loads straight onto this rank's GPU (device_map).
  On CPU no device_map is needed: from_pretrained(quantization_config=...) quantizes while
  loading, and bitsandbytes 0.50 runs Linear4bit forward and backward on the uint8
  Params4bit weights (its CPU backend; without the optional `kernels` package it logs
  once that it falls back from the kernels-community gemm).
- Sharded (FSDP or DeepSpeed over several ranks): bnb_4bit_quant_storage = the compute dtype, so
  FSDP2 shards the packed weights (accelerate 1.15 fsdp_utils.py fsdp2_prepare_model puts a
  uint8 Params4bit in ignored_params, whole on every rank; torch's fully_shard itself shards a
  uint8 one on CPU too); with CPU offload on GPUs the base loads into host RAM and only the
  QuantStates move to the rank's GPU (place_quant_states). FSDP2's units are the model's
  _no_split_modules (transformers' TRANSFORMER_BASED_WRAP, the class set of peft's
  fsdp_auto_wrap_policy); the Trainer saves FSDP checkpoints adapter_only.
- A sequence-classification PeftModel adds the head ("classifier", "score") to
  modules_to_save (peft_model.py PeftModelForSequenceClassification): the head trains in full.
"""

from __future__ import annotations

import os
from typing import Any

from gpuplan.apply.errors import REPLAN, ApplyError
from gpuplan.lifecycle.run_dir import MERGED_DIR
from gpuplan.plan.types import Plan

# peft TaskType per model.task; masked-lm has none (a plain PeftModel).
_PEFT_TASK = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS", "masked-lm": None}


def method(plan: Plan) -> str:
    """The name of the fine-tuning method the plan resolved (plan/methods.py), as runs record it."""
    return plan.resolved.model.method.name


def uses_adapters(plan: Plan) -> bool:
    """Adapters on a frozen base (lora, qlora)."""
    return plan.resolved.model.method.frozen_base


def merges(plan: Plan) -> bool:
    """output.merge_adapter on adapters over an unquantized base: final/merged/ is written."""
    m = plan.resolved.model.method
    return plan.resolved.output.merge_adapter and m.frozen_base and not m.quantized_base


def check(plan: Plan) -> None:
    """Refuse, before anything loads, a plan whose adapter settings apply cannot honour."""
    m = plan.resolved.model.method
    if not m.frozen_base:
        return
    if plan.resolved.model.from_scratch:
        raise ApplyError(
            f"model.method = {m.name!r} trains adapters on a frozen pretrained base, but model.from_scratch = true "
            'would freeze random weights; set model.method = "full" to train from scratch, or point '
            "model.name_or_path at a pretrained model and set model.from_scratch = false"
        )
    if plan.resolved.output.merge_adapter and m.quantized_base:
        raise ApplyError(
            'output.merge_adapter = true with model.method = "qlora": merging into a 4-bit base would '
            "round the adapter away; set output.merge_adapter = false (load the adapter on the base with peft), "
            'or use model.method = "lora"'
        )
    lora_config(plan)  # every lora.* value checked here, before hours of loading
    if m.quantized_base:
        from gpuplan.apply.model.quant4 import quantization_config

        quantization_config(plan)


def lora_config(plan: Plan) -> Any:
    """peft's LoraConfig with the planned values (names as in peft's LoraConfig)."""
    from peft import LoraConfig

    lora = plan.resolved.lora
    targets: str | list[str] = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    if isinstance(targets, list):
        if not targets or not all(targets):
            raise ApplyError(f"lora.target_modules = {targets!r} must name at least one module; {REPLAN}")
    elif targets != "all-linear":
        raise ApplyError(f"lora.target_modules = {targets!r} is not a list of module names; {REPLAN}")
    r, alpha, dropout = lora.r, lora.lora_alpha, lora.lora_dropout
    if r < 1:
        raise ApplyError(f"lora.r = {r!r} must be a positive integer (the adapter rank), e.g. lora.r = 16")
    if alpha is None or alpha <= 0:
        raise ApplyError(f"lora.lora_alpha = {alpha!r} must be a positive number, e.g. lora.lora_alpha = {2 * r}")
    if not 0.0 <= dropout < 1.0:
        raise ApplyError(f"lora.lora_dropout = {dropout!r} must be in [0, 1), e.g. lora.lora_dropout = 0.05")
    try:
        return LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=targets,
            use_dora=lora.use_dora,
            modules_to_save=list(lora.modules_to_save) if lora.modules_to_save else None,  # a copy: peft extends it for seq-cls
            bias="none",
            task_type=_PEFT_TASK.get(plan.resolved.model.task),
        )
    except (ValueError, TypeError) as e:
        raise ApplyError(f"the plan's [lora] settings were refused by peft: {e}") from e


def wrap(plan: Plan, model: Any) -> Any:
    """The PeftModel whose only trainable parameters are the adapters (and modules_to_save)."""
    from peft import get_peft_model

    from gpuplan.apply.model.vision import is_vision_language, lora_exclude

    vision = is_vision_language(plan)
    model = prepare_base(plan, model)
    config = lora_config(plan)
    if vision:  # LoRA kept off the frozen tower and projector, whose q_proj / v_proj share the names (model/vision.py);
        config.exclude_modules = lora_exclude(plan)  # with vision.train_tower none is excluded: the adapters reach the tower
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:  # "Target modules {...} not found in the base model"
        raise target_error(plan, model, e) from e
    trainable, _ = peft_model.get_nb_trainable_parameters()
    if trainable == 0:
        raise ApplyError("the adapters have no trainable parameters; check lora.target_modules and lora.r")
    return peft_model


def target_error(plan: Plan, model: Any, e: Exception) -> ApplyError:
    names = sorted({n.rsplit(".", 1)[-1] for n, mod in model.named_modules() if _is_linear(mod)})
    return ApplyError(
        f"lora.target_modules = {_listed(plan.resolved.lora.target_modules)!r} does not fit this model: {e}. "
        f"Its linear layers are named: {', '.join(names)}"
    )


def _listed(targets: str | tuple[str, ...]) -> str | list[str]:
    """lora.target_modules as the spec writes it (a list, not the plan's tuple)."""
    return targets if isinstance(targets, str) else list(targets)


def prepare_base(plan: Plan, model: Any) -> Any:
    """The base as get_peft_model needs it: qlora's kbit preparation, input grads for checkpointing.
    (TRL's preference trainers wrap it themselves from lora_config, apply/train/preference.py.)"""
    from peft import prepare_model_for_kbit_training

    checkpointing = plan.resolved.training.gradient_checkpointing
    if plan.resolved.model.method.quantized_base:
        from gpuplan.apply.model.quant4 import place_quant_states

        place_quant_states(plan, model, "cpu" if plan.hardware.is_cpu else "cuda")
        keep_training_layout(model)
        # use_reentrant=False: what the Trainer passes when it enables checkpointing again
        # (transformers 5.24 modeling_utils._activation_checkpointing_enable).
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    if checkpointing:
        # A frozen base gives the checkpointed blocks no input that requires grad. The
        # non-reentrant checkpointing transformers 5.24 runs (use_reentrant=False) still
        # passes the adapters their gradients; this keeps them flowing should a caller
        # turn reentrant checkpointing on (tests/apply/test_checkpoint_reentrancy.py).
        model.enable_input_require_grads()
    return model


def keep_training_layout(model: Any) -> None:
    """Keep every 4-bit weight in the layout it trains in, also while the Trainer evaluates.

    bitsandbytes 0.50 Linear4bit.forward repacks its weight in place for CPU inference the
    first time it runs in eval mode without grad on an AVX512-BF16 CPU (nn/modules.py,
    functional._convert_weight_packed_for_cpu): the absmax becomes bfloat16 and later
    training steps run through gemv_4bit, which has no autograd kernel (torch warns
    "silently incorrect behavior"), so after the first evaluation the adapters below a
    layer would get wrong gradients. Turning the repack off keeps the dequantize path.
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def _is_linear(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ in ("Linear4bit", "Linear8bitLt")


def trainable_params(model: Any) -> int:
    """Parameters the optimizer updates, counted as peft counts them (4-bit weights unpacked)."""
    if hasattr(model, "get_nb_trainable_parameters"):
        return int(model.get_nb_trainable_parameters()[0])
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def save_final(plan: Plan, trainer: Any, final_dir: str) -> str | None:
    """Save the adapter (peft's format) into final_dir, and the merged model when planned.

    trainer.save_model on a PeftModel writes adapter_model.safetensors and adapter_config.json
    (+ the tokenizer). The merged model goes to final_dir/merged/, not beside the adapter:
    transformers 5.24 from_pretrained on a directory holding adapter_config.json as well
    loads that adapter on top of the directory's model (integrations/peft.py
    maybe_load_adapters), which would apply the adapter twice to merged weights.
    Returns the merged directory, or None.
    """
    from gpuplan.apply.model.final import save_final_model

    save_final_model(trainer, final_dir)  # safetensors and JSON only
    if not merges(plan):
        return None
    if not trainer.is_world_process_zero():
        return None
    merged_dir = os.path.join(final_dir, MERGED_DIR)
    merged = trainer.model.merge_and_unload()  # the adapter folded into the base weights, in place
    merged.save_pretrained(merged_dir)  # safetensors by default
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(merged_dir)
    return merged_dir
