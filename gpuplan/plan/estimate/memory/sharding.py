"""Model states per GPU under data parallelism: DDP, FSDP2 and DeepSpeed ZeRO, and what they gather.

Pure arithmetic over ModelFacts and Workload; no torch. P parameters, N = shard_world_size.
ZeRO (Rajbhandari et al. 2020, section 5, mixed precision, Adam K = 12): per GPU
  stage 1: 2P + 2P + 12P/N   stage 2: 2P + 14P/N   stage 3: 16P/N
What the engines the Trainer drives (transformers 5.24, accelerate 1.15, torch 2.13) hold:

DDP. accelerate DistributedDataParallelKwargs defaults gradient_as_bucket_view=False
  (accelerate utils/dataclasses.py) and the Trainer passes only find_unused_parameters,
  bucket_cap_mb, broadcast_buffers, static_graph (trainer.py create_accelerator...): the
  reducer then keeps its own flat bucket buffers, a second copy of every gradient
  (torch nn/parallel/distributed.py docstring of gradient_as_bucket_view: the saving
  "will be equal to the total gradients size"), allocated at construction.

FSDP (FSDP2 fully_shard, what apply asks for: fsdp_config version 2). With Trainer AMP
  (accelerate mixed_precision != "no") accelerate upcasts every trainable parameter to
  fp32 before sharding (utils/fsdp_utils.py fsdp2_prepare_model, "FSDP upcast of low
  precision parameters to fp32"), whatever model.dtype, and sets MixedPrecisionPolicy
  param_dtype = reduce_dtype = the AMP dtype (dataclasses.py set_mixed_precision): sharded
  fp32 params, grads (reduce-scatter output cast to the sharded dtype) and Adam states
  (16P/N), bf16 unsharded copies in flight. Without AMP everything stays in model.dtype.
  Units: each decoder layer (_no_split_modules), the input embedding, the tail
  [final norm, lm_head] with reshard_after_forward=False, the root.
  FULL_SHARD (reshard_after_forward=True): one layer gathered plus the next prefetched
  (FSDP2 prefetches one unit in forward and backward); the tail stays gathered from its
  forward to its backward. SHARD_GRAD_OP (False): every unit stays gathered from its
  forward until its backward. Each unit's unsharded gradient (reduce dtype) lives until its
  reduce-scatter finishes, which overlaps the next unit's backward.
  Accumulation: by default the Trainer wraps every micro-batch but the last in
  accelerator.no_sync, set_requires_gradient_sync(False) for FSDP2 (trainer.py training
  loop, accelerator.py no_sync): unsharded gradients of the whole model would persist
  between micro-batches (2P). The plan assumes apply passes
  accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}} with FSDP
  (FSDP_SYNC_EACH_BATCH), as communication.py's reduce-scatter per micro-batch does: the
  gradients stay sharded between micro-batches.
  CPU offload (CPUOffloadPolicy): sharded params, grads and optimizer states live in host
  RAM and the optimizer steps there.

DeepSpeed ZeRO (bf16/fp16 "auto" from TrainingArguments; the engine casts the module to
  16 bits, engine.py _configure_distributed_model; the client AdamW steps fp32 partitions).
  DeepSpeed 0.19 estimators: stage 2 = 2P + 18P/N (2 grads16 + 4 grads32 + 4 params32 +
  8 Adam, stage_1_and_2.py estimate_zero2_model_states_mem_needs), stage 3 = 18P/N +
  4 x largest layer (stage3.py estimate_zero3_model_states_mem_needs); stage 1 keeps full
  16-bit gradients: 2P + 2P + 16P/N. apply's config sets no bucket sizes, so DeepSpeed's
  defaults hold (runtime/zero/config.py): reduce_bucket_size 5e8 elements (one 16-bit ipg
  buffer, two with overlap_comm, default only for stage 3), stage3_prefetch_bucket_size
  5e7, stage3_param_persistence_threshold 1e5 (smaller params stay gathered).
  Offload: optimizer -> master, Adam and fp32 grads in host RAM; params (stage 3) -> the
  16-bit partitions too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.layout import ModelLayout
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES, optimizer_state_bytes, optimizer_step_temp_bytes
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.units import GIB

_DTYPE_NAME = {2: "16-bit", 4: "fp32"}
FSDP_SYNC_EACH_BATCH = True  # the plan's contract with apply, see above
DS_REDUCE_BUCKET = 500_000_000  # elements, deepspeed runtime/zero/config.py reduce_bucket_size
DS_PREFETCH_BUCKET = 50_000_000  # elements, stage3_prefetch_bucket_size
DS_PERSISTENCE_THRESHOLD = 100_000  # elements, stage3_param_persistence_threshold


@dataclass(frozen=True)
class ShardedStates:
    """Bytes per GPU. Backward gradients grow from 0 to `grads_backward` as backward runs."""

    weights: int  # resident parameters (a shard, or the full model)
    grads_backward: int  # gradients once backward is done (before the step)
    grads_step: int  # gradients at the optimizer step (adds fp32 partitions DeepSpeed makes)
    optimizer_states: int  # on the GPU (master weights counted here, as the ZeRO paper's K)
    step_temp: int  # transient bytes of the optimizer step on the GPU
    accumulated_grads: int  # gradients alive between micro-batches when accumulating
    buckets: int  # communication buffers alive at every moment
    gathered_forward: int  # unsharded parameters at the end of forward
    gathered_head: int  # ... while the head's backward runs (its params + unsharded grad)
    gathered_last_layer: int  # ... in the last layer's backward (params + grads in flight)
    gathered_first_layer: int  # ... in the first layer's backward
    host_bytes: int  # offloaded to host RAM
    autocast_casts: bool  # autocast still copies fp32 weights (False: 16-bit params in flight)
    notes: tuple[str, ...] = ()
    host_pinned: int = 0  # of host_bytes, page-locked (FSDP2 CPUOffloadPolicy pins the parameter shards)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@lru_cache(maxsize=256)
def _shard_numel(param_shapes: tuple, n: int) -> int:
    """Elements on the rank with the largest shard: FSDP2 chunks dim 0 of every tensor
    (torch.chunk, _fsdp_param.py), rank 0 gets ceil(dim0 / N) rows."""
    total = 0
    for _, shape in param_shapes:
        if not shape:
            total += 1
            continue
        total += _ceil_div(shape[0], n) * prod(shape[1:])
    return total


@lru_cache(maxsize=256)
def _small_params(param_shapes: tuple, threshold: int) -> int:
    return sum(prod(s) for _, s in param_shapes if prod(s) < threshold)


def _hashable(shapes) -> tuple:
    return shapes if isinstance(shapes, tuple) else tuple((n, tuple(s)) for n, s in shapes)


def sharded_states(facts: ModelFacts, wl: Workload, layout: ModelLayout, kind: str) -> ShardedStates:
    """Model states, buffers and gathered parameters of one GPU for wl.engine."""
    if wl.engine == "fsdp":
        return _fsdp(facts, wl, layout, kind)
    if wl.engine == "deepspeed":
        return _deepspeed(facts, wl, layout, kind)
    wb = DTYPE_BYTES[wl.weight_dtype]
    p = facts.n_params
    grads = wb * p
    states = optimizer_state_bytes(kind, p, layout.n_tensors, facts.param_shapes, wb)
    return ShardedStates(
        weights=wb * p,
        grads_backward=grads,
        grads_step=grads,
        optimizer_states=states,
        step_temp=optimizer_step_temp_bytes(kind, p, layout.largest_tensor, wb),
        accumulated_grads=grads if wl.gradient_accumulation_steps > 1 else 0,
        buckets=grads if wl.engine == "ddp" else 0,
        gathered_forward=0,
        gathered_head=0,
        gathered_last_layer=0,
        gathered_first_layer=0,
        host_bytes=0,
        autocast_casts=True,
        notes=(
            "DDP: 'gradients' includes the reducer's buckets, a second copy of the gradients "
            "(gradient_as_bucket_view=False, the accelerate default)",
        )
        if wl.engine == "ddp"
        else (),
    )


def _per_unit(facts: ModelFacts, layout: ModelLayout) -> tuple[int, int, int]:
    """(params of one decoder layer, of the tail unit: lm_head + final norm, of the embedding unit)."""
    layer = layout.layer_params // max(facts.num_layers, 1)
    embed = layout.head_params if layout.head_params else facts.vocab_size * facts.hidden_size
    outside = facts.n_params - layout.layer_params  # embeddings, head (if untied), final norm
    if facts.tie_word_embeddings:
        return layer, outside, 0  # tied: the embedding joins the tail unit (fsdp2_prepare_model)
    return layer, max(outside - embed, 0), embed


def _optimizer_shard(kind: str, shard: int, p: int, facts: ModelFacts, layout: ModelLayout, state_bytes: int, n_tensors: int) -> int:
    if kind in ("adamw", "adamw_fused"):
        return optimizer_state_bytes(kind, shard, n_tensors, (), state_bytes)
    full = optimizer_state_bytes(kind, p, layout.n_tensors, facts.param_shapes, state_bytes)
    return _ceil_div(full * shard, p)  # other optimizers: their states scale with the shard


def _fsdp(facts: ModelFacts, wl: Workload, layout: ModelLayout, kind: str) -> ShardedStates:
    n = max(wl.shard_world_size, 1)
    p = facts.n_params
    mixed = wl.amp is not None
    mb = 4 if mixed else DTYPE_BYTES[wl.weight_dtype]  # sharded dtype: fp32 after accelerate's upcast
    cb = 2 if mixed else mb  # unsharded dtype: MixedPrecisionPolicy param_dtype = reduce_dtype
    shard = _shard_numel(_hashable(facts.param_shapes), n)
    weights = grads = mb * shard
    states = _optimizer_shard(kind, shard, p, facts, layout, mb, layout.n_tensors)
    step_temp = mb * shard if kind == "adamw" else 0  # foreach sqrt: one state's worth of the shard
    layer, tail, embed = _per_unit(facts, layout)
    full = cb * p
    if wl.zero_stage >= 3:  # FULL_SHARD / HYBRID_SHARD
        fwd = cb * tail
        head = cb * (2 * tail + layer)  # tail params + its unsharded grad + last layer prefetched
        last = cb * (2 * layer + 2 * layer)  # current + prefetched params, current + reducing grads
        first = cb * (2 * layer + embed + layer)  # first layer, embedding prefetched, grads in flight
    else:  # SHARD_GRAD_OP: units stay gathered from forward to their backward
        fwd = full
        head = full + cb * tail
        last = full - cb * tail + cb * 2 * layer
        first = cb * (embed + layer) + cb * 2 * layer
    offload = wl.offload_params or wl.offload_optimizer
    host = weights + grads + states if offload else 0
    pinned = weights if offload else 0
    # between micro-batches: the sharded gradients (sync each batch; on the host with offload),
    # or, under no_sync, every unit's unsharded gradient
    accumulated = (0 if offload else grads) if FSDP_SYNC_EACH_BATCH else full
    if offload:
        weights = grads = states = step_temp = 0  # CPUOffloadPolicy: the step runs on the CPU
    return ShardedStates(
        weights=weights,
        grads_backward=grads,
        grads_step=grads,
        optimizer_states=states,
        step_temp=step_temp,
        accumulated_grads=accumulated if wl.gradient_accumulation_steps > 1 else 0,
        buckets=0,
        gathered_forward=fwd,
        gathered_head=head,
        gathered_last_layer=last,
        gathered_first_layer=first,
        host_bytes=host,
        autocast_casts=False,
        notes=_fsdp_notes(wl, n, mb, cb, host),
        host_pinned=pinned,
    )


def _deepspeed(facts: ModelFacts, wl: Workload, layout: ModelLayout, kind: str) -> ShardedStates:
    n = max(wl.shard_world_size, 1)
    p = facts.n_params
    stage = wl.zero_stage
    half = wl.amp is not None or DTYPE_BYTES[wl.weight_dtype] == 2
    lb = 2 if half else 4  # the module's dtype after DeepSpeed's cast
    part = _ceil_div(p, n)  # DeepSpeed pads the flat partition to N equal parts
    # fp32 master partition (16-bit only) + optimizer states on fp32 partitions: K = 12 for Adam
    master = 4 * part if half else 0
    states = master + _optimizer_shard(kind, part, p, facts, layout, 4, 2)  # 2 param groups: decay, no decay
    # stages 1-2: fp32 gradient partition made at the step (single_partition_of_fp32_groups[i].grad)
    fp32_grads = 4 * part if half else 0
    if stage == 1:
        weights, grads = lb * p, lb * p
    elif stage == 2:
        weights, grads = lb * p, lb * part
    else:  # stage 3 reduces 16-bit grads from the ipg bucket straight into the fp32 partition
        small = _small_params(_hashable(facts.param_shapes), DS_PERSISTENCE_THRESHOLD)
        weights, grads, fp32_grads = lb * (part + small), 4 * part, 0
    grads_step = grads + fp32_grads
    step_temp = 4 * part if kind == "adamw" else 0
    buckets = lb * DS_REDUCE_BUCKET * (2 if stage == 3 else 1)  # overlap_comm double-buffers at stage 3
    layer, _, _ = _per_unit(facts, layout)
    if stage == 3:
        # a module is gathered for its forward and released after; in backward its params and
        # 16-bit grads (DeepSpeed's "4 x largest layer") plus the prefetch bucket
        prefetch = lb * DS_PREFETCH_BUCKET
        fwd = 0
        head = 2 * lb * layout.head_params + prefetch
        last = 2 * lb * layer + prefetch
        first = 2 * lb * layer + prefetch
    else:
        fwd = head = last = first = 0
    host = 0
    if wl.offload_optimizer:  # ZeRO-Offload: master, Adam and fp32 gradients on the host
        host += states + (grads if stage == 3 else fp32_grads)
        states, step_temp = 0, 0
        if stage == 3:
            grads = 0
        grads_step = grads
    if wl.offload_params and stage == 3:
        host += lb * part
        weights -= lb * part
    return ShardedStates(
        weights=weights,
        grads_backward=grads,
        grads_step=grads_step,
        optimizer_states=states,
        step_temp=step_temp,
        accumulated_grads=grads if wl.gradient_accumulation_steps > 1 else 0,
        buckets=buckets,
        gathered_forward=fwd,
        gathered_head=head,
        gathered_last_layer=last,
        gathered_first_layer=first,
        host_bytes=host,
        autocast_casts=False,
        notes=_ds_notes(wl, n, half, host),
        host_pinned=host,  # apply's config: pin_memory = true
    )


def _fsdp_notes(wl: Workload, n: int, mb: int, cb: int, host: int) -> tuple[str, ...]:
    ranks, own = ("CPU processes", "each process") if wl.device == "cpu" else ("GPUs", "the GPU")
    where = f"host RAM ({host / GIB:.1f} GiB per GPU, CPU offload)" if host else own
    out = [
        f"FSDP ZeRO-{wl.zero_stage} over {n} {ranks}: {_DTYPE_NAME[mb]} shards of parameters, gradients "
        f"and optimizer states in {where}; 'weights' includes the {_DTYPE_NAME[cb]} units gathered in flight"
    ]
    if wl.gradient_accumulation_steps > 1 and FSDP_SYNC_EACH_BATCH:
        out.append(
            "FSDP with gradient accumulation: reduce-scatter every micro-batch (accelerate "
            "sync_each_batch), so gradients stay sharded between micro-batches"
        )
    return tuple(out)


def _ds_notes(wl: Workload, n: int, half: bool, host: int) -> tuple[str, ...]:
    out = [
        f"DeepSpeed ZeRO-{wl.zero_stage} over {n} GPUs ({'16-bit params, fp32 master and Adam' if half else 'fp32'}); "
        "'gradients' includes the reduce bucket (reduce_bucket_size 5e8 elements, DeepSpeed's default)"
    ]
    if host:
        out.append(f"offload: {host / GIB:.1f} GiB per GPU in host RAM")
    return tuple(out)
