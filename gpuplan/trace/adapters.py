"""LoRA and QLoRA under FakeTensorMode: the real peft model, the real bitsandbytes 4-bit layers.

What apply does, in the same order (the contract in docs/lora-qlora.md):
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

import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.methods import method_named

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_T = TypeVar("_T")
_TASK_TYPES = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS"}


def _adapters(wl: Workload) -> Adapters:
    """The workload's adapters: build_model applies them only to a workload that has them."""
    assert wl.adapters is not None, "a lora / qlora workload"
    return wl.adapters


def quantize_to_4bit(model: PreTrainedModel, wl: Workload) -> None:
    import bitsandbytes as bnb
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    a = _adapters(wl)
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
        if any(name == k or name.endswith("." + k) or k.startswith(name + ".") or (name + ".").startswith(k + ".") for k in keep):
            continue
        if isinstance(module, Conv1D):
            fan_in, fan_out = module.weight.shape
            weight = module.weight.data.t()
        else:
            fan_in, fan_out = module.in_features, module.out_features
            weight = module.weight.data
        new = _linear4bit(bnb, fan_in, fan_out, weight, module.bias, compute, a.double_quant, a.quant_type)
        model.set_submodule(name, new)
    # torch annotates Module.__setattr__ for tensors and modules; any other value is a plain attribute
    model.is_loaded_in_4bit = True  # type: ignore[assignment]
    model.config.quantization_config = {"load_in_4bit": True}


def _linear4bit(
    bnb, fan_in: int, fan_out: int, weight: torch.Tensor, bias, compute, double_quant: bool, quant_type: str
) -> torch.nn.Module:
    """A real bnb.nn.Linear4bit (its own forward, and peft dispatches its 4-bit LoRA layer on it)
    whose weight is the packed uint8 tensor and QuantState quantize_4bit returns on fake tensors.
    Params4bit itself cannot wrap a FakeTensor (_make_subclass refuses), so the weight is a plain
    frozen Parameter carrying the attributes bitsandbytes and peft read from a Params4bit."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        new = bnb.nn.Linear4bit(
            fan_in, fan_out, bias is not None, compute, compress_statistics=double_quant, quant_type=quant_type, device="meta"
        )
    packed, state = bnb.functional.quantize_4bit(
        weight.to(compute).contiguous(), blocksize=64, compress_statistics=double_quant, quant_type=quant_type, quant_storage=torch.uint8
    )
    param = torch.nn.Parameter(packed, requires_grad=False)
    for key, value in (
        ("quant_state", state),
        ("compress_statistics", double_quant),
        ("quant_type", quant_type),
        ("blocksize", 64),
        ("quant_storage", torch.uint8),
        ("bnb_quantized", True),
    ):
        setattr(param, key, value)
    new.weight = param
    new.quant_state = state
    new.compute_type_is_set = True
    new.support_avx512bf16_for_cpu = False
    if bias is not None:
        new.bias = torch.nn.Parameter(bias.data, requires_grad=False)
    return new


@contextmanager
def fake_4bit_dequant():
    """peft's dequantize_module_weight for the trace's 4-bit weights (DoRA reads the base weight).

    peft (utils/integrations.py) dequantizes a weight whose class is named Params4bit with
    bitsandbytes' dequantize_4bit(weight.data, weight.quant_state) and returns any other weight
    as it is. The trace's 4-bit weights are fake tensors carrying Params4bit's attributes
    (_linear4bit: Params4bit cannot wrap one), so peft would hand DoRA the packed uint8 tensor
    ("Attempting to broadcast ..."). Inside: the same call for them, nothing else changed."""
    import bitsandbytes as bnb
    from peft.tuners.lora import dora, layer

    saved = dora.dequantize_module_weight, layer.dequantize_module_weight

    def dequantize_module_weight(module):
        weight = getattr(module, "weight", None)
        if weight is not None and getattr(weight, "bnb_quantized", False) and getattr(weight, "quant_state", None) is not None:
            return bnb.functional.dequantize_4bit(weight.data, weight.quant_state)
        return saved[0](module)

    dora.dequantize_module_weight = layer.dequantize_module_weight = dequantize_module_weight
    try:
        yield
    finally:
        dora.dequantize_module_weight, layer.dequantize_module_weight = saved


def apply_adapters(model: PreTrainedModel, wl: Workload) -> torch.nn.Module:
    import peft

    a = _adapters(wl)
    if method_named(a.method).quantized_base:
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

    # patched for the build only, and put back below
    BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None  # type: ignore[method-assign]
    torch.nn.Module.to = to_same_device  # type: ignore[method-assign]
    try:
        with _fake_safe_copies():
            return _wrap(model, wl)
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = saved  # type: ignore[method-assign]
        torch.nn.Module.to = saved_to  # type: ignore[method-assign]


@contextmanager
def _fake_safe_copies():
    """peft's module copies without copy.deepcopy of fake tensors, which corrupts the heap.

    Deep-copying a module whose parameters are fake tensors ends in a segfault or "corrupted
    double-linked list" (rc 139/134) later in the process: seen with modules_to_save =
    ["lm_head", "embed_tokens"] on a tied model (peft utils/other.py ModulesToSaveWrapper
    copies each module) and with DoRA on 4-bit layers (tuners/lora/dora.py update_layer copies
    the Linear4bit). Inside: ModulesToSaveWrapper's copy gets fresh fake clones of the module's
    parameters and buffers (copy.deepcopy with them in its memo: the same tensors a real copy
    allocates; a tied pair becomes two matrices, as peft's copies are); DoRA's copy, which only
    feeds one dequantization while the layer is built, is the layer itself."""
    import copy
    import types

    from peft.tuners.lora import dora
    from peft.utils import other

    def deepcopy(obj, memo=None):
        memo = {} if memo is None else memo
        if isinstance(obj, torch.nn.Module):
            for t in [*obj.parameters(), *obj.buffers()]:
                if id(t) not in memo:
                    c = t.detach().clone()
                    memo[id(t)] = torch.nn.Parameter(c, t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
        return copy.deepcopy(obj, memo)

    def same(x: _T, memo: dict[int, Any] | None = None, _nil: Any = None) -> _T:  # copy.deepcopy's signature
        return x

    saved = other.copy, dora.deepcopy
    # the copy module other.py calls copy.deepcopy / copy.copy on: a stand-in with the same two functions
    other.copy = types.SimpleNamespace(deepcopy=deepcopy, copy=copy.copy)  # type: ignore[assignment]
    dora.deepcopy = same
    try:
        yield
    finally:
        other.copy, dora.deepcopy = saved


def _wrap(model: torch.nn.Module, wl: Workload) -> torch.nn.Module:
    import peft

    a = _adapters(wl)
    config = peft.LoraConfig(
        r=a.r,
        lora_alpha=2 * a.r,
        lora_dropout=a.lora_dropout,
        target_modules=list(a.target_modules),
        use_dora=a.use_dora,
        modules_to_save=list(a.modules_to_save) or None,
        task_type=_TASK_TYPES.get(wl.task),
        # a VLM's frozen tower and projector, as apply excludes them (plan/vision_settings.py lora_exclude)
        exclude_modules=("(" + "|".join(re.escape(p) for p in a.excluded_modules) + r")(\..*)?") if a.excluded_modules else None,
    )
    return peft.get_peft_model(model, config)
