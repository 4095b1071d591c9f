"""LoRA and QLoRA under FakeTensorMode: the real peft model, the real bitsandbytes 4-bit layers.

What apply does, in the same order (the contract in README "LoRA and QLoRA"):
- qlora: every nn.Linear/Conv1D but the modules transformers keeps unquantized
  (quantizers/base.py get_keys_to_not_convert: output embedding, tied weights, last
  module) becomes a bitsandbytes Linear4bit (transformers integrations/bitsandbytes.py
  replace_with_bnb_linear) whose Params4bit is quantized by bitsandbytes' own
  quantize_4bit: bitsandbytes registers fake kernels for its ops (bitsandbytes/_ops.py),
  so the packed uint8 weight, absmax and double-quant state get their real shapes and
  dtypes. Then peft's prepare_model_for_kbit_training (fp32 upcast of every 16-bit
  parameter that is not Params4bit), with the plan's checkpointing.
- get_peft_model with the plan's LoraConfig (autocast_adapter_dtype=True: adapters fp32).
- checkpointing with a frozen base: enable_input_require_grads, as the plan notes.
"""

from __future__ import annotations

import torch

from gpuplan.plan.estimate.memory.types import Workload

_TASK_TYPES = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS"}


def quantize_to_4bit(model: torch.nn.Module, wl: Workload) -> None:
    import bitsandbytes as bnb
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    a = wl.adapters
    if a.double_quant and "dynamic" not in bnb.functional.name2qmap:
        # the nested absmax code (256 fp32 values) is built from Python data, which fake tensors
        # cannot do: build it for real, once, as bitsandbytes caches it per process
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            bnb.functional.name2qmap["dynamic"] = bnb.functional.create_dynamic_map()
    keep = get_keys_to_not_convert(model)
    compute = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[a.compute_dtype]
    for name, module in list(model.named_modules()):
        if not (isinstance(module, Conv1D) or type(module) is torch.nn.Linear):
            continue
        if any(name == k or name.endswith("." + k) or k.startswith(name + ".") or (name + ".").startswith(k + ".")
               for k in keep):
            continue
        if isinstance(module, Conv1D):
            fan_in, fan_out = module.weight.shape
            weight = module.weight.data.t()
        else:
            fan_in, fan_out = module.in_features, module.out_features
            weight = module.weight.data
        new = _linear4bit(bnb, fan_in, fan_out, weight, module.bias, compute, a.double_quant, a.quant_type)
        model.set_submodule(name, new)
    model.is_loaded_in_4bit = True
    model.config.quantization_config = {"load_in_4bit": True}


def _linear4bit(bnb, fan_in: int, fan_out: int, weight: torch.Tensor, bias, compute, double_quant: bool,
                quant_type: str) -> torch.nn.Module:
    """A real bnb.nn.Linear4bit (its own forward, and peft dispatches its 4-bit LoRA layer on it)
    whose weight is the packed uint8 tensor and QuantState quantize_4bit returns on fake tensors.
    Params4bit itself cannot wrap a FakeTensor (_make_subclass refuses), so the weight is a plain
    frozen Parameter carrying the attributes bitsandbytes and peft read from a Params4bit."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        new = bnb.nn.Linear4bit(fan_in, fan_out, bias is not None, compute, compress_statistics=double_quant,
                                quant_type=quant_type, device="meta")
    packed, state = bnb.functional.quantize_4bit(weight.to(compute).contiguous(), blocksize=64,
                                                 compress_statistics=double_quant, quant_type=quant_type,
                                                 quant_storage=torch.uint8)
    param = torch.nn.Parameter(packed, requires_grad=False)
    for key, value in (("quant_state", state), ("compress_statistics", double_quant), ("quant_type", quant_type),
                       ("blocksize", 64), ("quant_storage", torch.uint8), ("bnb_quantized", True)):
        setattr(param, key, value)
    new.weight = param
    new.quant_state = state
    new.compute_type_is_set = True
    new.support_avx512bf16_for_cpu = False
    if bias is not None:
        new.bias = torch.nn.Parameter(bias.data, requires_grad=False)
    return new


def apply_adapters(model: torch.nn.Module, wl: Workload) -> torch.nn.Module:
    import peft

    a = wl.adapters
    if a.method == "qlora":
        quantize_to_4bit(model, wl)
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        for p in model.parameters():
            p.requires_grad_(False)
    if wl.gradient_checkpointing:
        model.enable_input_require_grads()
    # peft builds lora_A/B in fp32 and moves them to the base layer's dtype, then
    # autocast_adapter_dtype casts them back to fp32 (tuners_utils.py): the end state is
    # fp32 adapters either way. Module.to() cannot swap fake parameters, so the round trip
    # is skipped here.
    from peft.tuners.tuners_utils import BaseTunerLayer

    # Likewise module.to(weight.device) after injection: every fake tensor is on the CPU already.
    saved = BaseTunerLayer._move_adapter_to_device_of_base_layer
    saved_to = torch.nn.Module.to

    def to_same_device(self, *args, **kwargs):
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        return self if dtype is None else saved_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None
    torch.nn.Module.to = to_same_device
    try:
        return _wrap(model, wl)
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = saved
        torch.nn.Module.to = saved_to


def _wrap(model: torch.nn.Module, wl: Workload) -> torch.nn.Module:
    import peft

    a = wl.adapters
    config = peft.LoraConfig(
        r=a.r, lora_alpha=2 * a.r, lora_dropout=a.lora_dropout, target_modules=list(a.target_modules),
        use_dora=a.use_dora, modules_to_save=list(a.modules_to_save) or None,
        task_type=_TASK_TYPES.get(wl.task),
    )
    return peft.get_peft_model(model, config)
