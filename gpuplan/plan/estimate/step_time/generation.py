"""The generation of an online RL step (grpo / rloo) in the step-time model's terms. Pure arithmetic.

A round generates rl.generation_batch_size completions (TRL 1.16 grpo_trainer.py `_prepare_inputs`, every
steps_per_generation micro-steps); the trainer waits for it (generation and training alternate, in every
backend), so each part is a "device" term paid once per round, `rounds` rounds per optimizer step.
Per round, for the sequences one engine generates (transformers: the GPU's own; vLLM colocated: the
tensor-parallel group's, split over its GPUs; a vLLM server: its replica's share of the whole round):
- prefill: 2 N x prompt tokens, compute-bound: at the dtype's peak x the GEMM efficiency the step-time
  model fits for that many rows (terms.py gemm_efficiency). Every copy of a prompt (num_generations of
  them) is prefilled: transformers shares no prefix; vLLM's prefix cache would, so this is an upper bound
  there.
- decode: one step per completion token, max_completion_length steps (every completion runs to the limit:
  an upper bound, as a planner cannot know when a policy stops). A step reads the weights once and the KV
  cache of every sequence in flight (Pope et al. 2022, "Efficiently Scaling Transformer Inference",
  section 2: small-batch decoding is memory-bandwidth bound), and does 2 N FLOPs per sequence:
  max(bytes / bandwidth, FLOPs / (peak x efficiency)). transformers' generate launches the forward's
  kernels eagerly for every token (shape.py: forward kernels per layer x layers + the head), each
  kernel_s of host time, overlapped with the device work; vLLM replays CUDA graphs (no per-kernel launch
  cost counted). When vLLM's KV cache holds fewer sequences than it is sent, they decode in waves.
- weight sync: before each round TRL copies the policy's weights into vLLM (grpo_trainer.py
  `_move_model_to_vllm`; peft: merged into the base first, then unmerged): colocated, a device-to-device
  copy (read + write of the 16-bit weights at the memory bandwidth); to a server, an NCCL broadcast of the
  16-bit weights over the interconnect (NVLink inside a node, else the network).
- the old-policy and reference log-probs of the round are forwards without gradients, priced as the
  preference objectives' (throughput.py nograd_forward_terms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.flops import matmul_params
from gpuplan.plan.estimate.memory.generation import kv_per_token, vllm_plan
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.shape import HEAD_KERNELS, LAYER_KERNELS_FWD
from gpuplan.plan.estimate.step_time.terms import Term, gemm_efficiency

SAMPLING_KERNELS = 12  # per decode step: logits processors (temperature, top-p sort / cumsum / mask), softmax, multinomial


@dataclass(frozen=True)
class GenerationTime:
    """Seconds of one round, by part, and how many rounds an optimizer step runs."""

    prefill_s: float
    decode_s: float
    sync_s: float
    rounds_per_step: float
    sequences: int  # per engine
    waves: int

    @property
    def round_s(self) -> float:
        return self.prefill_s + self.decode_s + self.sync_s

    @property
    def per_step_s(self) -> float:
        return self.round_s * self.rounds_per_step


def generation_time(
    facts: ModelFacts,
    wl: Workload,
    gpu: GPUProfile,
    peak_flops: float,
    constants: K.ArchConstants,
    *,
    world_size: int,
    server_gpus: int | None = None,
    link_gbps: float | None = None,
) -> GenerationTime:
    """The generation of `wl`'s rounds (wl.generation != "none"); `peak_flops`: the compute dtype's dense peak (FLOP/s)."""
    n, _ = matmul_params(facts)
    tp = max(wl.vllm_tensor_parallel_size, 1)
    bw = gpu.memory_bandwidth_gbps * 1e9 * (1.0 if gpu.is_cpu else K.HBM_FRACTION)
    prompt = wl.seq_len - wl.rl_completion_len
    completion = wl.rl_completion_len
    waves = 1
    host_per_step = 0.0
    sync = 0.0
    weight_bytes = facts.n_params * 2  # the 16-bit weights vLLM holds and is sent
    if wl.generation == "transformers":
        seqs, share = wl.generation_sequences, 1  # the GPU's own sequences, on its own weights
        wb = 0.5 if (wl.adapters is not None and wl.adapters.method == "qlora") else (4 if wl.weight_dtype == "float32" else 2)
        read_weights: float = facts.n_params * wb
        kv_token: float = kv_per_token(facts, 4 if wl.weight_dtype == "float32" else 2)
        kernels = facts.num_layers * LAYER_KERNELS_FWD + HEAD_KERNELS + SAMPLING_KERNELS
        host_per_step = kernels * constants.kernel_s
    elif wl.generation == "vllm-colocate":
        seqs, share = wl.generation_sequences * tp, tp  # the TP group's sequences, each GPU a 1/tp slice
        read_weights = weight_bytes / tp
        kv_token = kv_per_token(facts, 2) / tp
        vp = vllm_plan(facts, wl, gpu)
        waves = max(1, math.ceil(vp.sequences / max(vp.concurrent, 1)))
        sync = 2 * weight_bytes / tp / bw
    else:  # vllm-server: its replicas share the whole round
        replicas = max(1, (server_gpus or tp) // tp)
        seqs, share = math.ceil(wl.generation_sequences * world_size / replicas), tp
        read_weights = weight_bytes / tp
        kv_token = kv_per_token(facts, 2) / tp
        link = (link_gbps or 25.0) * 1e9
        sync = weight_bytes / link
    eff_prefill = gemm_efficiency(constants, max(seqs * prompt, 1), facts.hidden_size)
    prefill = 2 * n * seqs * prompt / share / (peak_flops * eff_prefill)
    per_wave = math.ceil(seqs / waves)
    ctx = prompt + completion / 2  # the average context a decode step reads
    step_bytes = read_weights + per_wave * ctx * kv_token
    step_flops = 2 * n * per_wave / share
    device = max(step_bytes / bw, step_flops / (peak_flops * gemm_efficiency(constants, per_wave, facts.hidden_size)))
    decode = completion * waves * max(device, host_per_step)
    samples = wl.per_device_batch * wl.gradient_accumulation_steps
    rounds = samples / max(wl.generation_sequences, 1)
    return GenerationTime(prefill, decode, sync, rounds, seqs, waves)


def generation_terms(g: GenerationTime, wl: Workload) -> list[Term]:
    """The round's parts as step terms (group "generation"), per optimizer step."""
    r = g.rounds_per_step
    each = f" x {r:g} rounds per step" if r != 1 else ""
    out = [
        Term(
            "generation prefill",
            "generation",
            g.prefill_s * r,
            "step",
            "device",
            f"2N x {g.sequences} sequences x {wl.seq_len - wl.rl_completion_len} prompt tokens, compute-bound{each}",
            "step_time/generation.py",
        ),
        Term(
            "generation decode",
            "generation",
            g.decode_s * r,
            "step",
            "device",
            f"{wl.rl_completion_len} decode steps x {g.waves} wave(s), each max(weights + KV cache read / bandwidth, 2N x batch / peak)"
            f"{each}",
            "step_time/generation.py (Pope et al. 2022)",
        ),
    ]
    if g.sync_s:
        out.append(
            Term(
                "weight sync to vLLM",
                "generation",
                g.sync_s * r,
                "step",
                "device",
                f"the 16-bit weights copied into vLLM before each round{each}",
                "trl/trainer/grpo_trainer.py _move_model_to_vllm",
            )
        )
    return out
