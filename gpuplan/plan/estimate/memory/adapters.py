"""Peak memory of LoRA / QLoRA steps: a frozen base, trainable adapters, part by part.

From the code paths of peft 0.21 and bitsandbytes 0.50 (what apply runs):
- Frozen base (lora): every parameter in model.dtype. (qlora): the linear layers as
  bitsandbytes 4-bit blocks (memory/quant4.py), the rest (embeddings, norms, biases,
  the LM or classification head) in fp32: peft's prepare_model_for_kbit_training
  casts every 16-bit parameter that is not Params4bit to fp32.
- Adapters in fp32 whatever the base dtype: get_peft_model(autocast_adapter_dtype=True)
  upcasts bf16/fp16 adapter weights (tuners_utils.py cast_adapter_dtype). Their
  gradients are fp32; AdamW keeps two fp32 states per adapter value. Saved modules
  (modules_to_save) train a copy of the module in its own dtype (fp32 under qlora).
- Activations: a frozen linear layer keeps no input for a weight gradient; lora_A
  keeps its input (cast to the adapter's dtype or, under autocast, to 16 bits) and
  lora_B keeps lora_A's output (r values per token); DoRA keeps more per target. The
  frozen layer plus each target's own tensors: memory/lora_activations.py, measured
  per block style and mode by tracing the real peft model (benchmarks/lora_coefficients.py;
  integer coefficients, zero residual over target subsets). Packed examples under SDPA
  add the mask's bias per layer (memory/packed_mask.py).
- Under autocast, frozen fp32 weights are not in autocast's weight cache (it caches
  only leaves that require grad: aten autocast_mode.cpp cached_cast), but each matmul's
  16-bit copy of the weight is saved for the input gradient: 2 bytes per castable
  parameter, as full fine-tuning's cache. A 4-bit weight is never cast: bitsandbytes'
  MatMul4Bit saves the packed weight and dequantizes it again in backward
  (autograd/_functions.py), a transient of 2 bytes per value of one layer.
- No gradient of any frozen weight exists; the head's weight gradient is gone.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from math import prod

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.modelinfo.lora_targets import lora_candidates, peft_matches, saved_modules
from gpuplan.plan.estimate.memory.activations import STYLE_OF, ActivationParts, activation_parts, mode_of
from gpuplan.plan.estimate.memory.adapters_sharded import sharded_adapter_states
from gpuplan.plan.estimate.memory.layout import model_layout
from gpuplan.plan.estimate.memory.lora_activations import dora_transient_bytes, lora_layer_bytes, lora_mode
from gpuplan.plan.estimate.memory.loss_chunking import loss_tokens
from gpuplan.plan.estimate.memory.overhead import peak_moment
from gpuplan.plan.estimate.memory.packed_mask import packed_mask_layer_bytes, packed_mask_outside_bytes
from gpuplan.plan.estimate.memory.preference import reference_bytes
from gpuplan.plan.estimate.memory.quant4 import base_4bit_split
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES, optimizer_kind, optimizer_state_bytes, optimizer_step_temp_bytes
from gpuplan.plan.estimate.memory.types import Adapters, MemoryEstimate, Workload
from gpuplan.plan.estimate.memory.vision import pixel_input_bytes


@dataclasses.dataclass(frozen=True)
class AdapterLayout:
    adapter_params: int
    adapter_shapes: tuple  # (name, shape) of every trainable tensor
    saved_params: int
    targets_per_layer: int
    largest_target: int


@lru_cache(maxsize=256)
def adapter_layout(facts: ModelFacts, a: Adapters) -> AdapterLayout:
    saved = list(a.modules_to_save)
    shapes: list[tuple[str, tuple[int, ...]]] = []
    per_layer = 0
    largest = 0
    layers = max(facts.num_layers, 1)
    for name, _, fan_in, fan_out in lora_candidates(facts, saved, a.excluded_modules):
        hit = next((t for t in a.target_modules if peft_matches(name, t)), None)
        if hit is None:
            continue
        shapes += [(f"{name}.lora_A", (a.r, fan_in)), (f"{name}.lora_B", (fan_out, a.r))]
        if a.use_dora:
            shapes.append((f"{name}.lora_magnitude_vector", (fan_out,)))
        per_layer += 1
        largest = max(largest, fan_in * fan_out)
    adapter = sum(prod(s) for _, s in shapes)
    saved_params = 0
    for m in saved_modules(facts, saved):
        own = [(name, s) for name, s in facts.param_shapes if name.startswith(m + ".")]
        if not own and m == "lm_head":  # a tied head: its saved copy is a matrix of its own
            own = [("lm_head.weight", (facts.vocab_size, facts.hidden_size))]
        for name, s in own:
            shapes.append((f"{name}.copy", s))
            saved_params += prod(s) if s else 1
    return AdapterLayout(adapter, tuple(shapes), saved_params, per_layer // layers, largest)


def estimate_adapter_memory(facts: ModelFacts, wl: Workload, gpu: GPUProfile | None = None) -> MemoryEstimate:
    a = wl.adapters
    assert a is not None
    notes: list[str] = []
    lay = adapter_layout(facts, a)
    qlora = a.method == "qlora"
    base, saved_b, largest4 = _frozen_base(facts, wl, a, notes)
    adapter_w, saved_w = _trainable_weights(lay, saved_b, notes)
    ref_gpu, ref_host = reference_bytes(facts, wl)  # a separate frozen reference, sharded as TRL shards it
    weights = base + adapter_w + saved_w + ref_gpu
    grads = adapter_w + saved_w
    kind, states, step_temp = _optimizer_states(wl, lay, grads, notes)

    # activations: the base's parts (embeddings, loss path, MLP gradients) from the full model,
    # the layers from the measured LoRA rows
    awl = dataclasses.replace(wl, weight_dtype="float32") if qlora else wl
    parts = activation_parts(facts, awl)
    per_layer, first_saving = _lora_layer_activations(facts, awl, a, notes)
    layers = facts.num_layers
    casts = _autocast_casts(facts, wl, a, lay)
    grad_logits = _logits_gradient(facts, wl, qlora)
    dequant = 2 * largest4  # one layer's dequantized weight in its matmul (compute dtype)
    saved_acts, fwd_casts, bwd_casts, recompute = _saved_activations(facts, awl, parts, per_layer, first_saving, casts)
    offloaded = 0
    if wl.offload_activations and not wl.gradient_checkpointing:
        # memory/offload_activations.py: one layer on the GPU at a time, the rest in pinned host RAM
        offloaded = saved_acts + bwd_casts
        saved_acts, bwd_casts = per_layer, bwd_casts // max(layers, 1)
    acc = grads if wl.gradient_accumulation_steps > 1 else 0

    # DDP's reducer keeps flat bucket copies of the trainable gradients (memory/sharding.py, DDP)
    buckets = grads if wl.engine == "ddp" else 0
    gathered = dict.fromkeys(("fwd", "head", "last", "first"), 0)
    host = pinned = 0
    if wl.engine in ("fsdp", "deepspeed"):  # the base and the adapters' states sharded (memory/adapters_sharded.py)
        sh = sharded_adapter_states(facts, wl, lay.adapter_params, lay.saved_params, lay.adapter_shapes, kind)
        weights, grads, states, step_temp, acc, buckets = (sh.weights, sh.grads, sh.states, sh.step_temp, sh.accumulated, sh.buckets)
        gathered = {"fwd": sh.gathered_forward, "head": sh.gathered_head, "last": sh.gathered_last_layer, "first": sh.gathered_first_layer}
        host, pinned = sh.host_bytes, sh.pinned_bytes
        notes.extend(sh.notes)

    def moment(g: int, act: int, logits: int, temp: int = 0, at: str = "") -> dict[str, int]:
        return {
            "weights": weights + gathered.get(at, 0),
            "gradients": g + buckets,
            "optimizer_states": states,
            "activations": act,
            "logits_loss": logits,
            "temporaries": temp,
        }

    first = (
        parts.per_layer_checkpointed + recompute
        if wl.gradient_checkpointing
        else per_layer + (bwd_casts if offloaded else bwd_casts // max(layers, 1))
    )
    moments = [
        moment(acc, saved_acts + fwd_casts, parts.logits_fwd, pixel_input_bytes(facts, wl), at="fwd"),
        moment(acc, saved_acts + bwd_casts, parts.logits_bwd_start, at="fwd"),
        moment(acc, saved_acts + bwd_casts, grad_logits, at="head"),
        moment(acc, saved_acts + bwd_casts + recompute, 0, parts.layer_backward + dequant, at="last"),
        moment(max(acc, grads), first, 0, parts.layer_backward + dequant, at="first"),
        moment(grads, 0, 0, step_temp),
        moment(acc, saved_acts + fwd_casts, 0, dora_transient_bytes(facts, awl)),  # DoRA's per-forward weights
    ]
    if qlora and (wl.engine == "deepspeed" or (wl.engine == "fsdp" and not wl.offload_params)):
        # loaded whole onto each GPU before the engine shards it (memory/host.py): the 4-bit base + its fp32 rest
        moments.append({"weights": base, "gradients": 0, "optimizer_states": 0, "activations": 0, "logits_loss": 0, "temporaries": 0})
    allocated, overhead, components = peak_moment(moments, wl.device, gpu)
    if wl.gradient_checkpointing:
        # transformers 5.24 modeling_utils._activation_checkpointing_enable: {"use_reentrant": False}
        # unless the caller passes kwargs (the Trainer passes gradient_checkpointing_kwargs = None)
        notes.append(
            "checkpointing a frozen base: transformers checkpoints non-reentrantly (use_reentrant=False), "
            "so the adapters inside checkpointed blocks get gradients though the layer inputs do not "
            "require grad; apply also calls enable_input_require_grads(), which only reentrant "
            "checkpointing would need"
        )
    return MemoryEstimate(
        int(allocated),
        int(allocated + overhead),
        components,
        "analytic",
        tuple(notes),
        host_bytes=int(host + offloaded + ref_host),
        host_pinned_bytes=int(pinned + offloaded + ref_host),
        offloaded_activation_bytes=int(offloaded),
    )


def _frozen_base(facts: ModelFacts, wl: Workload, a: Adapters, notes: list[str]) -> tuple[int, int, int]:
    """The frozen base's bytes, the bytes per value of saved modules' copies, and its largest 4-bit layer."""
    qlora = a.method == "qlora"
    wb = DTYPE_BYTES[wl.weight_dtype]
    n_base = facts.n_params
    if qlora:
        q_bytes, q_values, rest, largest4 = base_4bit_split(facts, a.double_quant)
        base = q_bytes + 4 * rest
        saved_b = 4
        notes.append(
            f"qlora: {q_values / 1e9:.2f}B linear weights in 4-bit {a.quant_type} blocks of 64"
            f"{' with double-quantized absmax' if a.double_quant else ''} ({q_bytes / 1024**3:.2f} GiB); "
            f"prepare_model_for_kbit_training upcasts the other {rest / 1e6:.0f}M parameters (embeddings, "
            f"norms, head) to fp32 ({4 * rest / 1024**3:.2f} GiB)"
        )
    else:
        base = wb * n_base
        saved_b = wb
        largest4 = 0
    if largest4:
        notes.append(
            f"qlora: each 4-bit matmul dequantizes its weight to {a.compute_dtype} in forward and again in "
            f"backward (bitsandbytes MatMul4Bit): up to {2 * largest4 / 1024**2:.0f} MiB transient per layer"
        )
    if not qlora:
        notes.append(f"lora: frozen base in {wl.weight_dtype} ({base / 1024**3:.2f} GiB), no gradients for it")
    return base, saved_b, largest4


def _trainable_weights(lay: AdapterLayout, saved_b: int, notes: list[str]) -> tuple[int, int]:
    """The bytes of the trainable weights: the fp32 adapters and the saved modules' copies."""
    adapter_w = 4 * lay.adapter_params  # fp32: autocast_adapter_dtype
    notes.append(
        f"adapters: {lay.adapter_params / 1e6:.1f}M values in fp32 whatever the base dtype (peft's "
        f"autocast_adapter_dtype): {adapter_w / 1024**2:.0f} MiB weights + {adapter_w / 1024**2:.0f} MiB "
        f"gradients + optimizer states"
    )
    saved_w = saved_b * lay.saved_params
    return adapter_w, saved_w


def _optimizer_states(wl: Workload, lay: AdapterLayout, grads: int, notes: list[str]) -> tuple[str, int, int]:
    """The optimizer's kind, its states over the trainable values, and its step's temporaries."""
    kind, note = optimizer_kind(wl.optim)
    if note:
        notes.append(note)
    n_train = lay.adapter_params + lay.saved_params
    if kind in ("adamw", "adamw_fused"):
        states = 2 * grads + 4 * len(lay.adapter_shapes)
    else:
        states = optimizer_state_bytes(kind, n_train, len(lay.adapter_shapes), lay.adapter_shapes, 4)
    step_temp = optimizer_step_temp_bytes(kind, n_train, max((prod(s) for _, s in lay.adapter_shapes), default=0), 4)
    if kind.startswith("bnb8") or kind == "adafactor":
        adam = 2 * grads
        notes.append(
            f"adapters: {wl.optim} keeps {states / 1024**2:.0f} MiB of optimizer states where AdamW "
            f"would keep {adam / 1024**2:.0f} MiB: little to gain with {n_train / 1e6:.1f}M trainable values"
        )
    return kind, states, step_temp


def _lora_layer_activations(facts: ModelFacts, awl: Workload, a: Adapters, notes: list[str]) -> tuple[int, int]:
    """What one layer saves (the frozen layer plus its adapters' tensors), and per token what the first layer saves less."""
    style = STYLE_OF.get(facts.model_type, "llama")
    tokens = awl.per_device_batch * awl.seq_len
    # the layers: the frozen layer plus each adapter's own tensors (memory/lora_activations.py)
    per_token, layer_const, first_saving, row_note = lora_layer_bytes(facts, awl, style)
    if row_note:
        notes.append(row_note)
    per_layer = tokens * per_token + layer_const + packed_mask_layer_bytes(facts, awl, lora_mode(awl) != "fp32")
    if a.use_dora:
        notes.append(
            "DoRA: each target keeps its base output and lora_B's output for the magnitude's gradient"
            + (
                "; with lora_dropout the base output is recomputed from the dropped input and its weight "
                "(a 16-bit copy under autocast or from 4-bit) stays saved"
                if a.lora_dropout > 0
                else ""
            )
        )
    return per_layer, first_saving


def _autocast_casts(facts: ModelFacts, wl: Workload, a: Adapters, lay: AdapterLayout) -> tuple[int, int, int]:
    """Autocast's 16-bit weight copies: of the adapters, of the base's castable weights, of the head."""
    qlora = a.method == "qlora"
    wb = DTYPE_BYTES[wl.weight_dtype]
    layout = model_layout(facts)
    amp = wl.amp is not None
    adapter_casts = 2 * lay.adapter_params if amp else 0
    if amp and qlora:
        base_casts = 2 * max(layout.cast_params - base_4bit_split(facts, a.double_quant)[1], 0)
    elif amp and wl.weight_dtype == "float32":
        base_casts = 2 * layout.cast_params
    else:
        base_casts = 0
    head_casts = 2 * layout.head_params if amp and (qlora or wb == 4) else 0
    if wl.engine in ("fsdp", "deepspeed"):  # the engine gathers 16-bit parameters: autocast casts none
        adapter_casts = base_casts = head_casts = 0
    return adapter_casts, base_casts, head_casts


def _logits_gradient(facts: ModelFacts, wl: Workload, qlora: bool) -> int:
    """The gradient of the logits in the head's backward (0 where the loss never makes it)."""
    wb = DTYPE_BYTES[wl.weight_dtype]
    amp = wl.amp is not None
    tokens = wl.per_device_batch * wl.seq_len
    # the logits' gradient in the head's compute dtype
    # one chunk with chunked cross-entropy; none after the head with Liger's fused loss (memory/liger.py)
    lt = 0 if wl.liger_kernel else loss_tokens(tokens, wl.loss_chunk_size)
    grad_logits = lt * facts.vocab_size * (2 if amp or (not qlora and wb == 2) else 4) if wl.task != "seq-cls" else 0
    if wl.objective != "sft":
        grad_logits = 0  # TRL's fused head: in its backward (activations.py logits_bwd_start)
    return grad_logits


def _saved_activations(
    facts: ModelFacts, awl: Workload, parts: ActivationParts, per_layer: int, first_saving: int, casts: tuple[int, int, int]
) -> tuple[int, int, int, int]:
    """What stays saved for backward: activations, autocast's copies (forward, backward), a recomputed layer."""
    adapter_casts, base_casts, head_casts = casts
    mode = mode_of(awl)
    tokens = awl.per_device_batch * awl.seq_len
    h = facts.hidden_size
    layers = facts.num_layers
    if awl.gradient_checkpointing:
        # outside the checkpointed layers only the final norm's input (residual dtype) and the
        # int64 positions stay saved (measured against the trace, benchmarks/lora_memory_accuracy.py)
        resid = 2 if mode == "half" else 4
        saved_acts = layers * parts.per_layer_checkpointed + tokens * (resid * h + 8) + packed_mask_outside_bytes(awl)
        fwd_casts = adapter_casts + head_casts  # per-op casts of checkpointed layers are not kept
        bwd_casts = head_casts  # autocast's cache is gone once forward leaves autocast
        recompute = per_layer + (base_casts - head_casts) // max(layers, 1) + adapter_casts // max(layers, 1)
    else:
        # measured (benchmarks/lora_memory_accuracy.py): with frozen embeddings and no input
        # gradients, nothing outside the layers stays saved at the backward peak
        saved_acts = layers * per_layer - tokens * first_saving  # the first layer: from its first adapter on
        fwd_casts = bwd_casts = adapter_casts + base_casts  # saved for the input gradients
        recompute = 0
    return saved_acts, fwd_casts, bwd_casts, recompute
