"""LoRA / QLoRA model states per GPU under FSDP2 and DeepSpeed ZeRO: the frozen base sharded part by part.

Pure arithmetic, no torch. N = shard_world_size, A = trainable values (adapters + saved modules).
What the engines do with a peft model (transformers 5.24, accelerate 1.15, peft 0.21, torch 2.13,
bitsandbytes 0.50), read from their code:

FSDP2 (fsdp_config version 2, what apply asks for).
- Units: transformers' TRANSFORMER_BASED_WRAP on the model's _no_split_modules (training_args.py
  fsdp_plugin_args; the PeftModel forwards _no_split_modules to the base, the same class set peft's
  fsdp_auto_wrap_policy collects in peft/utils/other.py _get_no_split_modules), plus the input
  embedding, the tail [final norm, lm_head] with reshard_after_forward=False and the root
  (accelerate utils/fsdp_utils.py fsdp2_prepare_model). FSDP2 shards every parameter on its own
  (per-parameter DTensor, dim 0), so frozen and trainable tensors share a unit: FSDP1's reason for
  peft's lambda policy (one flat parameter needs one requires_grad) is gone.
- The frozen base is sharded like any parameter: 1/N of it per GPU. Under AMP accelerate upcasts
  only requires_grad tensors to fp32 (fsdp_utils.py "FSDP upcast of low precision parameters"):
  the adapters (already fp32, peft autocast_adapter_dtype); the base keeps model.dtype.
- QLoRA: a Params4bit whose storage is uint8 (bitsandbytes' default) is put in ignored_params
  and stays whole on every GPU (fsdp_utils.py: "Default uint8 quant_storage cannot survive
  fully_shard's DTensor conversion"); apply therefore sets bnb_4bit_quant_storage to the compute
  dtype (apply/model/adapters.py, peft's FSDP+QLoRA guide), and the packed bytes, ceil(n/2) per weight,
  shard like the rest. The QuantState (absmax, nested absmax, code) is an attribute of the
  Params4bit, not a parameter or buffer (bitsandbytes nn/modules.py), so FSDP leaves it whole on
  every GPU. accelerate casts nothing when a Params4bit is present (the fp32 upcast and the
  rank-0 meta loading are both skipped, fsdp_utils.py:815, :830); peft's
  prepare_model_for_kbit_training has made the other parameters fp32 (memory/quant4.py; KBIT_UPCAST below: code
  that quantizes without it keeps them in the dtype it loaded).
- In flight: each unit is all-gathered in MixedPrecisionPolicy.param_dtype (the AMP dtype;
  without AMP the stored dtype), the packed 4-bit bytes unchanged (storage dtype = compute dtype).
  FULL_SHARD: the unit running and the next one prefetched; the tail stays gathered from its
  forward to its backward. SHARD_GRAD_OP: every unit stays gathered until its backward. Only
  trainable tensors get an unsharded gradient (reduce dtype = param dtype), until its
  reduce-scatter ends in the next unit's backward.
- CPU offload (CPUOffloadPolicy, pin_memory=True by default, torch fsdp/_fully_shard/_fsdp_api.py):
  the sharded parameters (base and adapters), their gradients and the optimizer states live in
  host RAM and the optimizer steps there; the parameter shards are page-locked. The QuantStates
  stay on the GPU.

DeepSpeed ZeRO (runtime/zero/stage3.py, stage_1_and_2.py; the engine casts the module to
16 bits, engine.py _configure_distributed_model). Only the trainable parameters are in the
optimizer's groups, so only they get fp32 master partitions, Adam states and fp32 gradient
partitions (12A/N + 4A/N). Stage 3 partitions every parameter, the frozen base too (16-bit,
QLoRA's packed bytes in their quant storage, as peft's DeepSpeed guide requires:
bnb_4bit_quant_storage = the compute dtype); parameters under
stage3_param_persistence_threshold (1e5 elements: norms, most LoRA matrices) stay gathered.
Stages 1-2 keep the base whole. Buckets: the 16-bit reduce bucket holds at most the trainable
gradients (reduce_bucket_size 5e8 elements, two with overlap_comm at stage 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from math import prod

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.quant4 import base_4bit_split, quantized_layers
from gpuplan.plan.estimate.memory.sharding import DS_PERSISTENCE_THRESHOLD, DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET
from gpuplan.plan.estimate.memory.states import optimizer_state_bytes
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.units import GIB

_LAYER = re.compile(r"\.(\d+)\.")  # a repeated block's parameter (memory/layout.py)
# QLoRA's unquantized parameters (embeddings, norms, the head) are fp32 at rest and, without AMP, in flight:
# prepare_model_for_kbit_training upcasts them, as gpuplan's apply runs it. benchmarks/published_rows.py plans runs
# of code that quantizes without it (fsdp_qlora's train.py keeps them in the bf16 it loads) with False.
KBIT_UPCAST = True


@dataclass(frozen=True)
class BaseParts:
    """The frozen base in the bytes it is stored in, split the way the engines treat it."""

    shardable: int  # stored bytes FSDP / ZeRO-3 can shard: packed 4-bit weights + the other parameters
    replicated: int  # QLoRA's QuantStates, whole on every GPU
    layer: int  # one decoder layer's shardable bytes, as stored
    layer_gathered: int  # ... as all-gathered (param dtype)
    tail_gathered: int  # final norm + LM head, all-gathered
    embed_gathered: int  # the input embedding (0 when tied: it joins the tail)
    small: int  # elements of base tensors under DeepSpeed's persistence threshold


@dataclass(frozen=True)
class AdapterShards:
    """Bytes per GPU (host_bytes: per rank in host RAM)."""

    weights: int  # the base (shard or replica), its QuantStates and the adapters' share
    grads: int  # trainable gradients at the step
    states: int  # optimizer states (DeepSpeed: with the fp32 master partition)
    step_temp: int
    buckets: int
    accumulated: int  # gradients alive between micro-batches
    gathered_forward: int
    gathered_head: int
    gathered_last_layer: int
    gathered_first_layer: int
    host_bytes: int
    pinned_bytes: int  # of host_bytes, page-locked
    gathered_per_step: int  # bytes one GPU all-gathers per micro-batch (time terms)
    notes: tuple[str, ...] = ()


@lru_cache(maxsize=256)
def base_parts(facts: ModelFacts, qlora: bool, double_quant: bool, stored: int, gathered: int) -> BaseParts:
    """stored / gathered: bytes per value of the unquantized parameters at rest / in flight."""
    layers = max(facts.num_layers, 1)
    q_layers = quantized_layers(facts) if qlora else ()
    packed = sum(-(-fi * fo // 2) for _, _, fi, fo in q_layers)
    q_values = sum(fi * fo for _, _, fi, fo in q_layers)
    q_bytes = base_4bit_split(facts, double_quant)[0] if qlora else 0
    total = sum(prod(s) if s else 1 for _, s in facts.param_shapes)
    layer_values = sum(prod(s) if s else 1 for n, s in facts.param_shapes if _LAYER.search(n))
    rest_layer = max(layer_values - q_values, 0) // layers  # norms, biases (and every weight, lora)
    outside = total - layer_values
    embed = 0 if facts.tie_word_embeddings else min(facts.vocab_size * facts.hidden_size, outside)
    small = sum(prod(s) if s else 1 for _, s in facts.param_shapes if (prod(s) if s else 1) < DS_PERSISTENCE_THRESHOLD)
    return BaseParts(
        shardable=packed + stored * (total - q_values),
        replicated=q_bytes - packed,
        layer=packed // layers + stored * rest_layer,
        layer_gathered=packed // layers + gathered * rest_layer,
        tail_gathered=gathered * (outside - embed),
        embed_gathered=gathered * embed,
        small=small,
    )


def sharded_adapter_states(
    facts: ModelFacts, wl: Workload, adapter_values: int, saved_values: int, adapter_shapes: tuple, kind: str
) -> AdapterShards:
    a = wl.adapters
    assert a is not None
    n = max(wl.shard_world_size, 1)
    qlora = a.method == "qlora"
    wb = {"float32": 4, "bfloat16": 2, "float16": 2}[wl.weight_dtype]
    amp = wl.amp is not None
    trainable = adapter_values + saved_values
    layers = max(facts.num_layers, 1)
    if wl.engine == "deepspeed":
        return _deepspeed(facts, wl, n, trainable, adapter_shapes, kind, qlora, layers)
    stored = 4 if qlora and KBIT_UPCAST else wb
    cb = 2 if amp else stored  # MixedPrecisionPolicy.param_dtype
    base = base_parts(facts, qlora, a.double_quant, stored, cb)
    t_shard = -(-trainable // n)
    adapter_w = 4 * t_shard  # fp32 (autocast_adapter_dtype; accelerate's upcast of trainable tensors)
    grads = 4 * t_shard
    states = optimizer_state_bytes(kind, t_shard, len(adapter_shapes), (), 4)
    step_temp = 4 * t_shard if kind == "adamw" else 0
    base_shard = -(-base.shardable // n)
    a_layer = adapter_values // layers
    g_layer = base.layer_gathered + cb * a_layer
    d_layer = cb * a_layer  # the unit's unsharded adapter gradients until their reduce-scatter
    d_tail = cb * saved_values  # a saved head trains in the tail unit
    full = g_layer * layers + base.tail_gathered + base.embed_gathered
    if wl.zero_stage >= 3:  # FULL_SHARD
        fwd = base.tail_gathered
        head = base.tail_gathered + d_tail + g_layer
        last = 2 * g_layer + 2 * d_layer
        first = 2 * g_layer + base.embed_gathered + 2 * d_layer
        per_step = 2 * full - base.tail_gathered  # the tail is not gathered again for backward
    else:  # SHARD_GRAD_OP: units stay gathered from forward to their backward
        fwd = full
        head = full + d_tail
        last = full - base.tail_gathered + 2 * d_layer
        first = base.embed_gathered + g_layer + 2 * d_layer
        per_step = full
    offload = wl.offload_params or wl.offload_optimizer
    accumulated = grads if wl.gradient_accumulation_steps > 1 else 0  # sync_each_batch: sharded
    host = pinned = 0
    notes = [
        f"FSDP ZeRO-{wl.zero_stage} over {n} {'CPU processes' if wl.device == 'cpu' else 'GPUs'}: the frozen base "
        f"sharded, {base.shardable / GIB / n:.2f} GiB of {base.shardable / GIB:.2f} GiB per rank; 'weights' includes "
        f"the units gathered in flight ({g_layer / 2**20:.0f} MiB per decoder layer)"
    ]
    if qlora:
        notes.append(
            f"FSDP + qlora: bnb_4bit_quant_storage = the compute dtype so the packed 4-bit weights shard "
            f"(uint8 storage would stay whole on every GPU: accelerate ignores it); the QuantStates "
            f"({base.replicated / GIB:.2f} GiB) are not parameters and stay whole on every GPU"
        )
    weights = base_shard + base.replicated + adapter_w
    if offload:
        host = base_shard + adapter_w + grads + states
        pinned = base_shard + adapter_w
        weights, grads, states, step_temp, accumulated = base.replicated, 0, 0, 0, 0
        notes.append(
            f"FSDP CPU offload: {host / GIB:.1f} GiB per rank in host RAM ({pinned / GIB:.1f} GiB of it "
            "pinned parameter shards); each unit's shard is copied to the GPU before its all-gather and "
            "the optimizer steps on the CPU"
        )
    return AdapterShards(weights, grads, states, step_temp, 0, accumulated, fwd, head, last, first, host, pinned, per_step, tuple(notes))


def _deepspeed(
    facts: ModelFacts, wl: Workload, n: int, trainable: int, adapter_shapes: tuple, kind: str, qlora: bool, layers: int
) -> AdapterShards:
    stage = wl.zero_stage
    lb = 2  # DeepSpeed runs 16-bit modules (bf16/fp16 "auto" from TrainingArguments)
    a = wl.adapters
    assert a is not None
    base = base_parts(facts, qlora, a.double_quant, lb, lb)
    part = -(-trainable // n)
    master_states = 4 * part + optimizer_state_bytes(kind, part, 2, (), 4)  # fp32 master + Adam on the partition
    fp32_grads = 4 * part
    adapter_small = sum(prod(s) for _, s in adapter_shapes if prod(s) < DS_PERSISTENCE_THRESHOLD)
    bucket = lb * min(DS_REDUCE_BUCKET, trainable)
    if stage == 3:
        persistent = lb * (base.small + adapter_small)
        base_w = -(-base.shardable // n) + base.replicated
        weights = base_w + lb * part + persistent
        grads = fp32_grads  # 16-bit grads reduce from the bucket into the fp32 partition
        buckets = 2 * bucket  # overlap_comm double-buffers
        prefetch = lb * DS_PREFETCH_BUCKET
        g_layer = base.layer_gathered + lb * trainable // layers
        fwd, head = 0, 2 * base.tail_gathered + prefetch
        last = first = 2 * g_layer + prefetch
        per_step = 2 * (g_layer * layers + base.tail_gathered + base.embed_gathered)
    else:
        weights = base.shardable + base.replicated + lb * trainable
        grads = lb * (trainable if stage == 1 else part) + fp32_grads
        buckets = bucket
        fwd = head = last = first = per_step = 0
    host = pinned = 0
    states = master_states
    if wl.offload_optimizer:
        host += master_states + fp32_grads
        pinned += master_states + fp32_grads  # offload_optimizer pin_memory = true (apply's config)
        states, grads = 0, grads - fp32_grads
    if wl.offload_params and stage == 3:
        moved = -(-base.shardable // n) + lb * part
        host += moved
        pinned += moved
        weights -= moved
    notes = [
        f"DeepSpeed ZeRO-{stage} over {n} GPUs with adapters: fp32 master, Adam and gradient partitions only for "
        f"the {trainable / 1e6:.1f}M trainable values; the frozen base "
        + (f"partitioned ({base.shardable / GIB / n:.2f} GiB per GPU)" if stage == 3 else "whole on every GPU")
    ]
    if qlora:
        notes.append(
            "DeepSpeed + qlora: bnb_4bit_quant_storage = the compute dtype, so ZeRO-3 partitions the packed "
            "weights (peft's DeepSpeed guide); the 4-bit base loads whole onto each GPU first (apply builds the "
            "model before the DeepSpeed config exists, so zero.Init does not partition it while loading)"
        )
    return AdapterShards(
        weights,
        grads,
        states,
        0,
        buckets,
        grads if wl.gradient_accumulation_steps > 1 else 0,
        fwd,
        head,
        last,
        first,
        host,
        pinned,
        per_step,
        tuple(notes),
    )
