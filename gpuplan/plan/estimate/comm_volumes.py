"""Data-parallel communication per optimizer step: the bytes each GPU moves (their time is comm_time.py).

Ring collectives (Patarasuk & Yuan 2009; NCCL's bus-bandwidth model): an all-reduce
moves 2(N-1)/N of the buffer per GPU, a reduce-scatter or an all-gather (N-1)/N.
Per step, P parameters of b bytes (Rajbhandari et al. 2020, ZeRO, section 7):
  DDP, ZeRO-1 : one all-reduce of the gradients per optimizer step (no_sync while
                accumulating)                                   2(N-1)/N * P*b
  ZeRO-2      : reduce-scatter of gradients every micro-batch, all-gather of the
                updated parameters per step          (N-1)/N * P*b * (accum + 1)
  ZeRO-3      : all-gather in forward and in backward and a reduce-scatter,
                every micro-batch                             3(N-1)/N * P*b * accum
  FSDP2 SHARD_GRAD_OP (reshard_after_forward=False): one all-gather per micro-batch (the unit
                keeps its parameters through its backward and reshards after it: torch
                fsdp/_fully_shard/_fsdp_param_group.py post_backward, reshard_after_backward
                defaults to True) and a reduce-scatter per micro-batch (apply's sync_each_batch),
                not ZeRO-2's one all-gather per step          2(N-1)/N * P*b * accum
Bytes b: what the collectives carry, not what is stored. Under bf16/fp16 AMP FSDP2 gathers and
reduces in the compute dtype (accelerate utils/dataclasses.py FullyShardedDataParallelPlugin
set_mixed_precision: MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype), applied by
utils/fsdp_utils.py fsdp2_prepare_model over fp32 master parameters), and DeepSpeed's bf16/fp16
engine holds 16-bit parameters and gradients: 2 bytes for an fp32 master copy too. DDP reduces
the parameters' own gradients (fp32 under AMP): the stored dtype.
HYBRID_SHARD: ZeRO-3 inside a node, plus an all-reduce of each GPU's gradient shard
across nodes.

Sharded engines collective by collective (sharded_volumes; a LoRA base under FSDP / ZeRO-3), whose
seconds plan/estimate/comm_time.py prices term by term:
- FSDP2 (torch fsdp/_fully_shard, what apply runs): each unit is all-gathered in its forward and,
  under FULL_SHARD (reshard_after_forward=True), again in its backward; the tail unit
  (reshard_after_forward=False, accelerate fsdp2_prepare_model) and SHARD_GRAD_OP units once per
  micro-batch. Gradients of trainable tensors are reduce-scattered every micro-batch (apply's
  sync_each_batch, plan/estimate/memory/sharding.py). Frozen tensors (a LoRA base) are gathered but have
  no gradient to reduce.
- DeepSpeed ZeRO-3: each module's partitions are all-gathered for its forward and its backward;
  the 16-bit gradients are reduce-scattered into the partitions (runtime/zero/stage3.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.methods import method_of


def collective_bytes(wl: Workload) -> int:
    """Bytes per element the full fine-tune's collectives move (module docstring: "Bytes b")."""
    if wl.engine in ("fsdp", "deepspeed") and wl.amp in ("bf16", "fp16"):
        return 2
    return DTYPE_BYTES[wl.weight_dtype]


@dataclass(frozen=True)
class Volume:
    """What a full fine-tune's (or a DDP / ZeRO LoRA run's) collectives move per GPU per optimizer step."""

    bytes_per_gpu: float
    formula: str
    group: int  # the GPUs of one collective: the shard group under ZeRO, else every GPU
    cross_node_bytes: float = 0.0  # HYBRID_SHARD: each GPU's gradient shard all-reduced across nodes


def dense_volume(facts: ModelFacts, wl: Workload, *, world: int, nodes: int) -> Volume:
    """The bytes of the module docstring's table for `wl` on `world` GPUs over `nodes` nodes."""
    p_bytes = facts.n_params * collective_bytes(wl)
    if method_of(wl.adapters).frozen_base:
        # LoRA/QLoRA: DDP all-reduces only the trainable tensors' gradients (fp32 adapters)
        from gpuplan.plan.estimate.memory.adapters import adapter_layout

        lay = adapter_layout(facts, wl.adapters)
        p_bytes = 4 * (lay.adapter_params + lay.saved_params)
    accum = wl.gradient_accumulation_steps
    n = wl.shard_world_size if wl.zero_stage else world
    ring = (n - 1) / n
    if wl.adapters is not None and wl.zero_stage == 3:
        # a sharded frozen base is all-gathered in forward and backward like any other
        # parameter (4-bit where QLoRA quantized it); only the adapters' gradients are reduced
        from gpuplan.plan.estimate.flops import matmul_params

        body = matmul_params(facts)[0] - matmul_params(facts)[1]
        stored = DTYPE_BYTES[wl.weight_dtype]
        base = (facts.n_params - body) * stored + body * (0.5 if wl.adapters.method == "qlora" else stored)
        volume = ring * (2 * base + p_bytes) * accum
        formula = (
            "all-gather of the frozen base in forward and backward + reduce-scatter of the adapters' "
            "gradients per micro-batch: (N-1)/N x (2 x base + adapters) x accum"
        )
    elif wl.zero_stage <= 1:
        volume, formula = 2 * ring * p_bytes, "all-reduce of gradients per step: 2(N-1)/N x P x b"
    elif wl.zero_stage == 2 and wl.engine == "fsdp":
        volume = 2 * ring * p_bytes * accum
        formula = "FSDP2 shard_grad_op: all-gather + reduce-scatter per micro-batch: 2(N-1)/N x P x b x accum"
    elif wl.zero_stage == 2:
        volume = ring * p_bytes * (accum + 1)
        formula = "reduce-scatter per micro-batch + all-gather per step: (N-1)/N x P x b x (accum + 1)"
    else:
        volume, formula = 3 * ring * p_bytes * accum, "2 all-gathers + reduce-scatter per micro-batch: 3(N-1)/N x P x b x accum"
    cross = 2 * (nodes - 1) / nodes * p_bytes / n if wl.zero_stage == 3 and n < world else 0.0
    return Volume(volume, formula, n, cross)


def sharded_volumes(facts: ModelFacts, wl: Workload) -> tuple[int, int, int, int]:
    """(bytes all-gathered per micro-batch, gradient bytes reduce-scattered per micro-batch,
    this rank's shard bytes copied to the GPU per micro-batch, trainable values on this rank)."""
    n = max(wl.shard_world_size, 1)
    cb = 2 if wl.amp is not None or wl.engine == "deepspeed" else {"float32": 4}.get(wl.weight_dtype, 2)
    if wl.adapters is not None:
        from gpuplan.plan.estimate.memory.adapters import adapter_layout
        from gpuplan.plan.estimate.memory.adapters_sharded import sharded_adapter_states
        from gpuplan.plan.estimate.memory.states import optimizer_kind

        lay = adapter_layout(facts, wl.adapters)
        sh = sharded_adapter_states(facts, wl, lay.adapter_params, lay.saved_params, lay.adapter_shapes, optimizer_kind(wl.optim)[0])
        trainable = lay.adapter_params + lay.saved_params
        # each all-gather first copies this rank's 1/N of what it gathers to the GPU (with offload)
        return sh.gathered_per_step, cb * trainable, sh.gathered_per_step // n, -(-trainable // n)
    p = facts.n_params
    gathers = 2 if wl.zero_stage >= 3 else (1 if wl.engine == "fsdp" else 0)
    return gathers * cb * p, cb * p, gathers * cb * p // n, -(-p // n)


def sharded_step_volume(facts: ModelFacts, wl: Workload) -> float:
    """Bytes through each GPU's link per optimizer step of a sharded adapter run: every micro-batch's
    all-gathers (FSDP, ZeRO-3) and the reduce-scatter of the trainable gradients, (N-1)/N of each."""
    n = max(wl.shard_world_size, 1)
    gathered, grads, _, _ = sharded_volumes(facts, wl)
    accum = max(wl.gradient_accumulation_steps, 1)
    return accum * (n - 1) / n * ((gathered if wl.engine == "fsdp" or wl.zero_stage == 3 else 0) + grads)
