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

from gpuplan.plan.types import Plan

from .errors import ApplyError
from gpuplan.plan.methods import METHODS

QUANT_TYPES = ("nf4", "fp4")
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")
MERGED_DIR = "merged"  # final/merged/: see save_final
# peft TaskType per model.task; masked-lm has none (a plain PeftModel).
_PEFT_TASK = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS", "masked-lm": None}
_REPLAN = "re-run `gpuplan plan` to resolve it"


def method(plan: Plan) -> str:
    """The fine-tuning method the plan resolved; ApplyError for anything else."""
    m = plan.get("model.method") or "full"
    if m not in METHODS:
        raise ApplyError(f"model.method = {m!r} is not one of {list(METHODS)}; {_REPLAN}")
    return m


def uses_adapters(plan: Plan) -> bool:
    return method(plan) != "full"


def check(plan: Plan) -> None:
    """Refuse, before anything loads, a plan whose adapter settings apply cannot honour."""
    m = method(plan)
    if m == "full":
        return
    if plan.value("model.from_scratch"):
        raise ApplyError(
            f"model.method = {m!r} trains adapters on a frozen pretrained base, but model.from_scratch = true "
            "would freeze random weights; set model.method = \"full\" to train from scratch, or point "
            "model.name_or_path at a pretrained model and set model.from_scratch = false"
        )
    if plan.get("output.merge_adapter") and m == "qlora":
        raise ApplyError(
            "output.merge_adapter = true with model.method = \"qlora\": merging into a 4-bit base would "
            "round the adapter away; set output.merge_adapter = false (load the adapter on the base with peft), "
            "or use model.method = \"lora\""
        )
    lora_config(plan)  # every lora.* value checked here, before hours of loading
    if m == "qlora":
        quantization_config(plan)


def lora_config(plan: Plan) -> Any:
    """peft's LoraConfig with the planned values (names as in peft's LoraConfig)."""
    from peft import LoraConfig

    task = plan.value("model.task")
    targets = plan.value("lora.target_modules")
    if isinstance(targets, (list, tuple)):
        targets = list(targets)
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise ApplyError(f"lora.target_modules = {targets!r} must name at least one module; {_REPLAN}")
    elif targets != "all-linear":
        raise ApplyError(f"lora.target_modules = {targets!r} is not a list of module names; {_REPLAN}")
    r, alpha, dropout = plan.value("lora.r"), plan.value("lora.lora_alpha"), plan.value("lora.lora_dropout")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ApplyError(f"lora.r = {r!r} must be a positive integer (the adapter rank), e.g. lora.r = 16")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise ApplyError(f"lora.lora_alpha = {alpha!r} must be a positive number, e.g. lora.lora_alpha = {2 * r}")
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ApplyError(f"lora.lora_dropout = {dropout!r} must be in [0, 1), e.g. lora.lora_dropout = 0.05")
    to_save = plan.get("lora.modules_to_save")
    try:
        return LoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=float(dropout),
            target_modules=targets,
            use_dora=bool(plan.get("lora.use_dora")),
            modules_to_save=list(to_save) if to_save else None,  # a copy: peft extends it for seq-cls
            bias="none",
            task_type=_PEFT_TASK.get(task),
        )
    except (ValueError, TypeError) as e:
        raise ApplyError(f"the plan's [lora] settings were refused by peft: {e}") from e


def sharded(plan: Plan) -> bool:
    """FSDP or DeepSpeed over several ranks: the frozen base is sharded with the adapters."""
    world = int(plan.value("hardware.count")) * int(plan.value("hardware.nodes"))
    return world > 1 and plan.get("distributed.strategy") in ("fsdp", "deepspeed")


def loads_on_host(plan: Plan, device: str) -> bool:
    """QLoRA under FSDP with CPU offload on GPUs: the 4-bit base loads into host RAM (bitsandbytes quantizes
    there), never whole on one GPU; plan/estimate/memory/host.py counts it. Under DeepSpeed the base loads
    onto each GPU as without sharding (device_map), and the plan counts that load on the GPU."""
    fsdp_offload = plan.get("distributed.strategy") == "fsdp" and plan.get("distributed.fsdp_cpu_offload")
    return device == "cuda" and method(plan) == "qlora" and sharded(plan) and bool(fsdp_offload)


def quantization_config(plan: Plan, unquantized: list[str] | None = None) -> Any:
    """transformers' BitsAndBytesConfig for the frozen 4-bit base of a QLoRA run.

    `unquantized`: module names kept in their dtype (llm_int8_skip_modules, which the
    4-bit quantizer reads too); None keeps transformers' defaults (see load_kwargs).
    """
    import torch
    from transformers import BitsAndBytesConfig

    quant = plan.value("quantization.bnb_4bit_quant_type")
    double = plan.value("quantization.bnb_4bit_use_double_quant")
    compute = plan.value("quantization.bnb_4bit_compute_dtype")
    if quant not in QUANT_TYPES:
        raise ApplyError(f"quantization.bnb_4bit_quant_type = {quant!r} is not one of {list(QUANT_TYPES)}")
    if compute not in COMPUTE_DTYPES:
        raise ApplyError(
            f"quantization.bnb_4bit_compute_dtype = {compute!r} is not one of {list(COMPUTE_DTYPES)}; {_REPLAN}"
        )
    # sharded: the packed weights stored in the compute dtype, so FSDP2 shards them (accelerate
    # fsdp_utils.py fsdp2_prepare_model leaves a uint8 Params4bit whole on every rank) and ZeRO-3
    # partitions them (peft's DeepSpeed + QLoRA guide); the bytes are the same
    storage = {"bnb_4bit_quant_storage": getattr(torch, compute)} if sharded(plan) else {}
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=quant,
        bnb_4bit_use_double_quant=bool(double),
        bnb_4bit_compute_dtype=getattr(torch, compute),
        llm_int8_skip_modules=unquantized,
        **storage,
    )


def trained_in_full(plan: Plan) -> list[str]:
    """Modules that train in full beside the adapters: lora.modules_to_save, and for seq-cls
    the head names peft adds itself (peft_model.py PeftModelForSequenceClassification)."""
    names = list(plan.get("lora.modules_to_save") or [])
    if plan.value("model.task") == "seq-cls":
        names += ["classifier", "score"]
    return sorted(set(names))


def default_unquantized(plan: Plan, cls: Any) -> list[str]:
    """What transformers 5.24 keeps out of 4-bit when given no skip list: tied weights, the
    output embeddings and the module of the last parameter (quantizers/base.py
    get_keys_to_not_convert), computed on a meta-device copy of the model (no memory)."""
    import torch
    from transformers import AutoConfig
    from transformers.quantizers.base import get_keys_to_not_convert

    from .model import local_model_dir

    # The model directory the weights load from: for a Hub id its snapshot at the planned
    # model.commit, not the id itself (that would read whatever main points at in the cache).
    config = AutoConfig.from_pretrained(local_model_dir(plan), local_files_only=True,
                                        trust_remote_code=bool(plan.value("model.trust_remote_code")))
    with torch.device("meta"):
        meta = cls.from_config(config, trust_remote_code=bool(plan.value("model.trust_remote_code")))
    return get_keys_to_not_convert(meta)


def load_kwargs(plan: Plan, device: str, cls: Any) -> dict[str, Any]:
    """Extra from_pretrained keyword arguments: the 4-bit config, and on CUDA this rank's GPU.

    Modules that train in full must stay unquantized: peft copies them to train, and a copy
    of a 4-bit Linear cannot train (bitsandbytes asserts in its forward). transformers keeps
    a seq-cls head in 4-bit by default: its last parameter is "classifier.bias", and
    get_keys_to_not_convert strips only ".weight". A skip list replaces transformers'
    defaults (base.py get_modules_to_not_convert), so the defaults are added back.
    """
    if method(plan) != "qlora":
        return {}
    keep = trained_in_full(plan)
    unquantized = sorted(set(default_unquantized(plan, cls)) | set(keep)) if keep else None
    config = quantization_config(plan, unquantized)
    # loaded in the compute dtype: QuantState.dtype is the dtype the weights are loaded in, and
    # MatMul4Bit's backward dequantizes to it (bitsandbytes autograd/_functions.py), so an fp32
    # load dequantizes every layer to fp32 and casts (3x the planned transient); the unquantized
    # parts are cast to fp32 by prepare_model_for_kbit_training either way (plan/rules/base_dtype.py)
    kwargs: dict[str, Any] = {"quantization_config": config, "dtype": config.bnb_4bit_compute_dtype}
    if loads_on_host(plan, device):
        kwargs["device_map"] = {"": "cpu"}  # place_quant_states moves the QuantStates to this rank's GPU
    elif device == "cuda":
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    return kwargs


def place_quant_states(plan: Plan, model: Any, device: str) -> None:
    """After a host load (loads_on_host): each QuantState to this rank's GPU. FSDP moves parameters and
    buffers (and keeps the shards in host RAM with offload) but not a QuantState, an attribute of the
    Params4bit and of its Linear4bit (bitsandbytes nn/modules.py), which its GPU matmul reads."""
    if not loads_on_host(plan, device):
        return
    target = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    for module in model.modules():
        for state in {id(s): s for s in (getattr(getattr(module, "weight", None), "quant_state", None),
                                         getattr(module, "quant_state", None)) if s is not None}.values():
            state.to(target)


def wrap(plan: Plan, model: Any) -> Any:
    """The PeftModel whose only trainable parameters are the adapters (and modules_to_save)."""
    from peft import get_peft_model

    model = prepare_base(plan, model)
    try:
        peft_model = get_peft_model(model, lora_config(plan))
    except ValueError as e:  # "Target modules {...} not found in the base model"
        raise target_error(plan, model, e) from e
    trainable, _ = peft_model.get_nb_trainable_parameters()
    if trainable == 0:
        raise ApplyError("the adapters have no trainable parameters; check lora.target_modules and lora.r")
    return peft_model


def target_error(plan: Plan, model: Any, e: Exception) -> ApplyError:
    names = sorted({n.rsplit(".", 1)[-1] for n, mod in model.named_modules() if _is_linear(mod)})
    return ApplyError(f"lora.target_modules = {plan.value('lora.target_modules')!r} does not fit this model: {e}. "
                      f"Its linear layers are named: {', '.join(names)}")


def prepare_base(plan: Plan, model: Any) -> Any:
    """The base as get_peft_model needs it: qlora's kbit preparation, input grads for checkpointing.
    (TRL's preference trainers wrap it themselves from lora_config, apply/preference.py.)"""
    from peft import prepare_model_for_kbit_training

    m = method(plan)
    checkpointing = bool(plan.value("training.gradient_checkpointing"))
    if m == "qlora":
        place_quant_states(plan, model, "cpu" if plan.hardware.vendor == "cpu" else "cuda")
        keep_training_layout(model)
        # use_reentrant=False: what the Trainer passes when it enables checkpointing again
        # (transformers 5.24 modeling_utils._activation_checkpointing_enable).
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    if checkpointing:
        # A frozen base gives the checkpointed blocks no input that requires grad. The
        # non-reentrant checkpointing transformers 5.24 runs (use_reentrant=False) still
        # passes the adapters their gradients; this keeps them flowing should a caller
        # turn reentrant checkpointing on (tests/test_checkpoint_reentrancy.py).
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
    from .final import save_final_model

    save_final_model(trainer, final_dir)  # safetensors and JSON only
    if not plan.get("output.merge_adapter") or method(plan) != "lora":
        return None
    if not trainer.is_world_process_zero():
        return None
    merged_dir = os.path.join(final_dir, MERGED_DIR)
    merged = trainer.model.merge_and_unload()  # the adapter folded into the base weights, in place
    merged.save_pretrained(merged_dir)  # safetensors by default
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(merged_dir)
    return merged_dir
