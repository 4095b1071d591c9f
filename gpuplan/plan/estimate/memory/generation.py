"""What generating the completions of an online RL step (grpo / rloo) adds to a training GPU's memory.

TRL 1.16 generates a whole round of completions (rl.generation_batch_size over all GPUs:
`generation_sequences` per GPU) at the start of each round (trl/trainer/grpo_trainer.py
`_prepare_inputs`: every steps_per_generation micro-steps, after the optimizer step and its zero_grad, so no
gradients exist then), keeps the round's tensors until its micro-batches are trained, and trains each
micro-batch as a causal-LM step over prompt + completion tokens through the fused log-prob head
(memory/preference.py fused_head_parts; the reference and old-policy log-probs are computed in that
round, without gradients, so no reference forward runs beside the policy's saved activations).

Per backend (the "generation" part of the estimate, memory/types.py COMPONENTS):
- transformers: `model.generate` on the policy itself, all the GPU's sequences at once (TRL
  `_generate_single_turn`). A moment of its own, beside the weights and optimizer states: the KV cache
  of generation_sequences x (prompt + completion) tokens in the weights' dtype (generate runs outside
  autocast), the prefill of the prompts through one layer, the last position's fp32 logits
  (memory/inference.py inference_memory, transformers' logits_to_keep = 1).
- vllm-colocate: vLLM in the training process (trl/generation/vllm_generation.py: LLM(...,
  gpu_memory_utilization, max_num_seqs = per-device batch x tensor-parallel size x steps_per_generation,
  max_num_batched_tokens = 4096, enable_sleep_mode)). vLLM takes gpu_memory_utilization x the GPU's total
  memory for its weight copy, its profiled workspace and, in what is left, its KV cache
  (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory: requested memory = total x
  gpu_memory_utilization, KV cache = requested - the non-KV memory the profile run measured). Without
  sleep mode it holds that share the whole run: training gets the rest. With sleep mode TRL puts it to
  sleep at level 2 after each generation (vllm_generation.py `self.llm.sleep(level=2)`: weights and KV
  cache freed) and wakes it for the next, so the share is alive only at the generation moment, beside
  the training weights and optimizer states.
- vllm-server: generation runs on the server's own GPUs (rl.vllm_server_gpus); the training GPUs hold
  only the round's tensors.
The round's tensors (all backends): prompt + completion ids and their attention mask (int64), the
completion mask, and per completion token the old-policy and reference log-probs and the advantages (fp32).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.inference import inference_memory
from gpuplan.plan.estimate.memory.overhead import overhead_bytes
from gpuplan.plan.estimate.memory.types import MemoryEstimate, Workload
from gpuplan.spec.objectives import Objective, objective, rl_objective
from gpuplan.units import GIB

VLLM_BATCHED_TOKENS = 4096  # vllm_generation.py LLM(max_num_batched_tokens=4096): the profile run's token count
VLLM_BLOCK = 16  # vLLM's default KV block size (tokens per block, vllm/config CacheConfig.block_size)
# CUDA graphs vLLM captures and its non-torch allocations (NCCL, the sampler's buffers), outside the profiled
# activations: vLLM v1 logs "Graph capturing finished in N secs, took X GiB"; about 0.5-1 GiB for 7B-class
# models on one GPU in its logs. Assumed 1 GiB (an assumption, not measured here; benchmarks/gpu_check.py
# rows measure it on a device).
VLLM_GRAPHS_BYTES = 1 * GIB
SHARE_STEP = 0.05  # the fit chooses vLLM's share in steps of 5% of the GPU


@dataclass(frozen=True)
class VllmPlan:
    """vLLM colocated on one training GPU."""

    share: float  # gpu_memory_utilization: the spec's, or the smallest step that holds every sequence
    share_bytes: int  # share x the GPU's memory
    weight_bytes: int  # its weight copy on this GPU (1 / tensor-parallel size of it)
    workspace_bytes: int  # the profile run's activations + CUDA graphs and non-torch memory
    kv_bytes: int  # what the share leaves for the KV cache
    one_sequence_kv: int  # KV of one sequence at full length (vLLM refuses to start below it)
    sequences: int  # sequences a generation round sends this GPU's engine share
    concurrent: int  # of them, how many the KV cache holds at full length
    needed_share: float  # the smallest step that holds them all

    @property
    def needed_bytes(self) -> int:
        return self.weight_bytes + self.workspace_bytes + self.sequences * self.one_sequence_kv


def step_objective(wl: Workload) -> Objective:
    """The objective descriptor of `wl`'s step: for grpo / rloo the forwards without gradients it runs
    (spec/objectives.py rl_objective): the reference's when one is planned (beta != 0), the policy's old
    log-probs with vLLM (TRL's importance-sampling correction, vllm_importance_sampling_correction = True
    by default) or when generation and optimization are misaligned (grpo_trainer.py
    `_generate_and_score_completions`: gradient_accumulation_steps % steps_per_generation != 0); rloo always."""
    if wl.generation == "none":
        return objective(wl.objective, wl.loss_type)
    steps = max(1, wl.generation_sequences // max(wl.per_device_batch, 1))
    old = wl.generation != "transformers" or wl.gradient_accumulation_steps % steps != 0
    return rl_objective(wl.objective, 1.0 if wl.reference != "none" else 0.0, old)


def rollout_bytes(wl: Workload) -> int:
    """The round's tensors TRL keeps on each GPU until its micro-batches are trained (see above): ids and
    attention masks of prompt + completion (int64), the advantages, and per completion token the old-policy
    log-probs (when computed) and the reference's (when planned), fp32. vLLM's importance-sampling ratio is one
    value per sequence in TRL's default "sequence_mask" mode: left out (n x 4 bytes)."""
    n, s, c = wl.generation_sequences, wl.seq_len, wl.rl_completion_len
    obj = step_objective(wl)
    per_token = obj.nograd_policy_sequences + (wl.reference != "none")
    return n * s * (8 + 8) + n * 4 + n * c * 4 * per_token


def kv_per_token(facts: ModelFacts, dtype_bytes: int) -> int:
    """KV-cache bytes per token: 2 (keys, values) x layers x KV heads x head_dim x bytes (memory/inference.py)."""
    return 2 * facts.num_layers * facts.num_key_value_heads * facts.head_dim * dtype_bytes


def vllm_plan(facts: ModelFacts, wl: Workload, gpu: GPUProfile) -> VllmPlan:
    """vLLM's share of one training GPU for `wl` (generation = "vllm-colocate")."""
    tp = max(wl.vllm_tensor_parallel_size, 1)
    wb = 0.5 if (wl.adapters is not None and wl.adapters.method == "qlora") else 2  # bf16 checkpoint; qlora: bitsandbytes 4-bit
    weights = int(facts.n_params * wb) // tp
    per_token = kv_per_token(facts, 2) // tp  # the KV heads are split over the tensor-parallel ranks
    blocks = -(-wl.seq_len // VLLM_BLOCK) * VLLM_BLOCK
    one = blocks * per_token
    profile = inference_memory(facts, dtype="bfloat16", context=VLLM_BATCHED_TOKENS, batch=1).activation_bytes // tp
    workspace = profile + VLLM_GRAPHS_BYTES
    seqs = wl.generation_sequences  # x tp sequences per engine, their KV split over tp GPUs
    total = gpu.memory_bytes
    needed = weights + workspace + seqs * one
    needed_share = min(0.95, math.ceil(needed / total / SHARE_STEP - 1e-9) * SHARE_STEP)
    share = wl.vllm_gpu_memory_utilization if wl.vllm_gpu_memory_utilization is not None else round(needed_share, 2)
    share_bytes = int(share * total)
    kv = max(0, share_bytes - weights - workspace)
    return VllmPlan(
        share=share,
        share_bytes=share_bytes,
        weight_bytes=weights,
        workspace_bytes=workspace,
        kv_bytes=kv,
        one_sequence_kv=one,
        sequences=seqs,
        concurrent=min(seqs, kv // max(one, 1)),
        needed_share=round(needed_share, 2),
    )


def transformers_generation(facts: ModelFacts, wl: Workload) -> tuple[int, int]:
    """(KV cache, prefill + logits working set) of model.generate over the GPU's sequences of a round."""
    dtype = "bfloat16" if wl.adapters is not None and wl.adapters.method == "qlora" else wl.weight_dtype
    mem = inference_memory(facts, dtype=dtype, context=wl.seq_len, batch=wl.generation_sequences, device=wl.device)
    prompt = wl.seq_len - wl.rl_completion_len
    prefill = inference_memory(facts, dtype=dtype, context=max(prompt, 1), batch=wl.generation_sequences, device=wl.device)
    return mem.kv_cache_bytes, prefill.activation_bytes


def with_generation(
    facts: ModelFacts, wl: Workload, est: MemoryEstimate, gpu: GPUProfile | None, *, rollout_counted: bool = False
) -> MemoryEstimate:
    """The training step's estimate with the generation part and the generation moment (see above);
    `rollout_counted`: `est` holds the round's tensors already (a traced step: gpuplan/trace/rl.py)."""
    if wl.generation == "none":
        return est
    c = dict(est.components)
    rollout = 0 if rollout_counted else rollout_bytes(wl)
    notes = list(est.notes)
    gen_moment: dict[str, int] | None = None
    during_training = rollout
    # alive at generation: the weights and optimizer states, no gradients (zeroed by the last step), no activations
    if wl.generation == "transformers":
        kv, work = transformers_generation(facts, wl)
        weights = c["weights"]
        if wl.engine == "deepspeed" and wl.zero_stage == 3 and wl.shard_world_size > 1:
            # GRPOConfig.ds3_gather_for_generation (default True): trl/models/utils.py unwrap_model_for_generation
            # gathers every ZeRO-3 partition for generate, so each GPU holds the whole model then
            weights = max(weights, facts.n_params * (2 if wl.weight_dtype != "float32" or wl.amp else 4))
            notes.append("generation under ZeRO-3: TRL gathers the whole model on each GPU (ds3_gather_for_generation)")
        gen_moment = {"weights": weights, "optimizer_states": c["optimizer_states"], "activations": work, "generation": rollout + kv}
        notes.append(
            f"generation (transformers): KV cache {kv / GIB:.2f} GiB for {wl.generation_sequences} sequences x {wl.seq_len} tokens, "
            f"beside the weights and optimizer states"
        )
    elif wl.generation == "vllm-colocate":
        if gpu is None or gpu.is_cpu:
            return dataclasses.replace(est, notes=(*notes, "vllm-colocate: no GPU to price vLLM's share on"))
        vp = vllm_plan(facts, wl, gpu)
        if wl.vllm_sleep:
            during_training += VLLM_GRAPHS_BYTES  # what sleep level 2 does not free
            gen_moment = {"weights": c["weights"], "optimizer_states": c["optimizer_states"], "generation": rollout + vp.share_bytes}
        else:
            during_training += vp.share_bytes
        notes.append(
            f"vLLM colocated: gpu_memory_utilization {vp.share:g} = {vp.share_bytes / GIB:.1f} GiB (weights {vp.weight_bytes / GIB:.1f}, "
            f"workspace {vp.workspace_bytes / GIB:.1f}, KV cache {vp.kv_bytes / GIB:.1f} GiB)"
            + (", asleep while training" if wl.vllm_sleep else "")
        )
    train_moment = {**{k: v for k, v in c.items() if k != "overhead"}, "generation": c.get("generation", 0) + during_training}
    peak = train_moment
    if gen_moment is not None and sum(gen_moment.values()) > sum(train_moment.values()):
        peak = gen_moment
        notes.append("the peak is the generation moment, not the training step")
    allocated = sum(peak.values())
    cc = gpu.compute_capability if gpu is not None else None
    overhead = overhead_bytes(allocated, wl.device, cc)
    components = {k: int(peak.get(k, 0)) for k in c if k != "overhead"}
    components["generation"] = int(peak.get("generation", 0))
    components["overhead"] = overhead
    return dataclasses.replace(
        est, allocated_peak_bytes=int(allocated), reserved_peak_bytes=int(allocated + overhead), components=components, notes=tuple(notes)
    )
