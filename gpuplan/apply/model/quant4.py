"""Loading the frozen 4-bit base of a QLoRA run: the BitsAndBytesConfig, what stays unquantized,
where it loads (this rank's GPU, or host RAM under FSDP + CPU offload) and its QuantStates.
See apply/model/adapters.py's docstring for what bitsandbytes, peft and transformers do as installed."""

from __future__ import annotations

import os
from typing import Any

from gpuplan.apply.errors import REPLAN, ApplyError
from gpuplan.plan.types import Plan


def sharded(plan: Plan) -> bool:
    """FSDP or DeepSpeed over several ranks: the frozen base is sharded with the adapters."""
    return plan.world_size > 1 and plan.resolved.distributed.sharded


def loads_on_host(plan: Plan, device: str) -> bool:
    """QLoRA under FSDP with CPU offload on GPUs: the 4-bit base loads into host RAM (bitsandbytes quantizes
    there), never whole on one GPU; plan/estimate/memory/host.py counts it. Under DeepSpeed the base loads
    onto each GPU as without sharding (device_map), and the plan counts that load on the GPU."""
    d = plan.resolved.distributed
    fsdp_offload = d.strategy == "fsdp" and d.fsdp_cpu_offload
    return device == "cuda" and plan.resolved.model.method.quantized_base and sharded(plan) and fsdp_offload


def quantization_config(plan: Plan, unquantized: list[str] | None = None) -> Any:
    """transformers' BitsAndBytesConfig for the frozen 4-bit base of a QLoRA run.

    `unquantized`: module names kept in their dtype (llm_int8_skip_modules, which the
    4-bit quantizer reads too); None keeps transformers' defaults (see load_kwargs).
    """
    import torch
    from transformers import BitsAndBytesConfig

    q = plan.resolved.quantization
    compute = q.bnb_4bit_compute_dtype
    if compute is None:  # the plan resolves "auto" for a 4-bit base (plan/rules/quantization.py)
        raise ApplyError(f"quantization.bnb_4bit_compute_dtype = 'auto' was not resolved by the plan; {REPLAN}")
    # sharded: the packed weights stored in the compute dtype, so FSDP2 shards them (accelerate
    # fsdp_utils.py fsdp2_prepare_model leaves a uint8 Params4bit whole on every rank) and ZeRO-3
    # partitions them (peft's DeepSpeed + QLoRA guide); the bytes are the same
    storage = {"bnb_4bit_quant_storage": getattr(torch, compute)} if sharded(plan) else {}
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=q.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=getattr(torch, compute),
        llm_int8_skip_modules=unquantized,
        **storage,
    )


def trained_in_full(plan: Plan) -> list[str]:
    """Modules that train in full beside the adapters: lora.modules_to_save, and for seq-cls
    the head names peft adds itself (peft_model.py PeftModelForSequenceClassification)."""
    names = list(plan.resolved.lora.modules_to_save or ())
    if plan.resolved.model.task == "seq-cls":
        names += ["classifier", "score"]
    return sorted(set(names))


def default_unquantized(plan: Plan, cls: Any) -> list[str]:
    """What transformers 5.24 keeps out of 4-bit when given no skip list: tied weights, the
    output embeddings and the module of the last parameter (quantizers/base.py
    get_keys_to_not_convert), computed on a meta-device copy of the model (no memory)."""
    import torch
    from transformers import AutoConfig
    from transformers.quantizers.base import get_keys_to_not_convert

    from gpuplan.hub.fetch import model_dir as hub_model_dir

    # The model directory the weights load from: for a Hub id its snapshot at the planned
    # model.commit, not the id itself (that would read whatever main points at in the cache).
    model_dir = hub_model_dir(plan.resolved.model.hub)
    if model_dir is None:  # model._from_pretrained refuses this before the 4-bit arguments are built
        raise ApplyError("model.name_or_path is not set: fine-tuning needs a local model directory", key="model.name_or_path")
    trust = plan.resolved.model.trust_remote_code
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust)
    with torch.device("meta"):
        meta = cls.from_config(config, trust_remote_code=trust)
    return get_keys_to_not_convert(meta)


def load_kwargs(plan: Plan, device: str, cls: Any) -> dict[str, Any]:
    """Extra from_pretrained keyword arguments: the 4-bit config, and on CUDA this rank's GPU.

    Modules that train in full must stay unquantized: peft copies them to train, and a copy
    of a 4-bit Linear cannot train (bitsandbytes asserts in its forward). transformers keeps
    a seq-cls head in 4-bit by default: its last parameter is "classifier.bias", and
    get_keys_to_not_convert strips only ".weight". A skip list replaces transformers'
    defaults (base.py get_modules_to_not_convert), so the defaults are added back.
    """
    if not plan.resolved.model.method.quantized_base:
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
        for state in {
            id(s): s
            for s in (getattr(getattr(module, "weight", None), "quant_state", None), getattr(module, "quant_state", None))
            if s is not None
        }.values():
            state.to(target)
