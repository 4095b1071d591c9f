"""Estimated training speed: FLOPs per step over an assumed fraction of peak.

Pure arithmetic on ModelFacts, Workload and GPUProfile; no torch.

The FLOPs per token are plan/estimate/flops.py's (6N + 12LHQT, with recomputation).
The FLOPs are reported (and calibration records them); the step time is the
step-time model's (plan/estimate/step_time), of which the matmuls are one term.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.flops import flops_per_token, nograd_forward_flops
from gpuplan.plan.estimate.memory import liger
from gpuplan.plan.estimate.memory.generation import step_objective
from gpuplan.plan.estimate.memory.preference import policy_workload
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.padding import ExampleLengths
from gpuplan.plan.estimate.step_time.constants import constants_for
from gpuplan.plan.estimate.step_time.generation import generation_terms, generation_time
from gpuplan.plan.estimate.step_time.model import StepTime, scaled_term
from gpuplan.plan.estimate.step_time.model import step_time as step_time_model
from gpuplan.plan.estimate.step_time.saver_terms import saver_terms
from gpuplan.plan.estimate.step_time.shape import saved_linear_params
from gpuplan.plan.estimate.step_time.terms import SAVED_GRADIENTS, Term
from gpuplan.plan.estimate.step_time.tower_terms import tower_terms
from gpuplan.plan.methods import method_of
from gpuplan.plan.sections import ThroughputSection

# The HF guide (docs/references.md; section "torch.empty_cache_steps"): emptying the
# cache costs "~10% slower training".
EMPTY_CACHE_SLOWDOWN = 0.10


def nograd_forward_terms(obj, workload: Workload, terms: Sequence[Term]) -> tuple[Term | None, Term | None]:
    """(the step's no-grad forwards as a micro-batch term, the precomputed reference forwards' term), from
    the policy's matmul and attention terms: a forward is 2 of the 2 + 4 (frozen base: 2 + 2, + 2 recomputed
    under checkpointing) units of a training pass (matmul_flops, step_time/terms.py); the no-grad
    sequences per graded sequence scale it."""
    if not (obj.is_preference or obj.is_rl):
        return None, None
    frozen = method_of(workload.adapters).frozen_base
    units = 2 + (2 if frozen else 4) + (2 if workload.gradient_checkpointing else 0)
    graded = sum(t.seconds for t in terms if t.group in ("matmuls", "attention") and t.per == "micro-batch" and t.name != SAVED_GRADIENTS)
    forward = graded * 2 / units / obj.grad_sequences  # one sequence per example, forward only

    def term(name: str, sequences: int) -> Term | None:
        if not sequences:
            return None
        return Term(
            name,
            "matmuls",
            forward * sequences,
            "micro-batch",
            "device",
            f"{sequences} forward(s) per example without gradients: 2/{units} of the policy's matmul and attention time per sequence",
            "spec/objectives.py",
        )

    ref = obj.reference_sequences
    if workload.reference == "precomputed":
        return term(f"{obj.name} forwards without gradients", obj.nograd_policy_sequences), term("reference", ref)
    return term(f"{obj.name} forwards without gradients", obj.nograd_policy_sequences + ref), None


def _server_link_gbps(gpu: GPUProfile) -> float:
    """GB/s of the link a vLLM server's weight broadcast crosses, the server on GPUs of the same node
    (`trl vllm-serve` beside the trainer): NVLink where the GPU has it, else PCIe (comm_time.py bandwidth_gbps)."""
    links = gpu.interconnect or {}
    return float(links.get("nvlink") or links.get("pcie", 16.0))


def compute_dtype(workload: Workload, gpu: GPUProfile, tf32: bool) -> str:
    """The dtype whose tensor-core peak bounds the matmuls of this workload."""
    if workload.amp == "bf16" or (workload.amp is None and workload.weight_dtype == "bfloat16"):
        return "bf16"
    if workload.amp == "fp16" or (workload.amp is None and workload.weight_dtype == "float16"):
        return "fp16"
    return "tf32" if tf32 and gpu.tf32 else "fp32"


def _padded(workload: Workload, obj: Any, example_lengths: ExampleLengths | None) -> tuple[Workload, str | None]:
    """The workload whose seq_len is the expected padded-to-longest length of a preference
    micro-batch (TRL pads to it: plan/estimate/padding.py), and the note saying so; unchanged otherwise.
    Only the time uses it: the memory section keeps the full seq_len."""
    if example_lengths is None or not obj.is_preference or not example_lengths.lengths:
        return workload, None
    padded = example_lengths.padded_length(workload.per_device_batch)
    if padded == workload.seq_len:
        return workload, None
    note = (
        f"{obj.name} sequences padded to the longest of each micro-batch of {workload.per_device_batch}, not to "
        f"seq_len: expected {padded} of {workload.seq_len} tokens, from {example_lengths.basis} (plan/estimate/padding.py); "
        f"memory is priced at the full {workload.seq_len}"
    )
    return dataclasses.replace(workload, seq_len=padded), note


class _StepFlops(NamedTuple):
    """The tokens and FLOPs of one optimizer step (estimate_throughput's counts)."""

    tokens: int
    model_per_token: float
    hw_per_token: float
    model_flops: float
    flops: float
    precompute: float


def _step_flops(facts: ModelFacts, workload: Workload, obj: Any, world_size: int, frozen: bool) -> _StepFlops:
    """The tokens per optimizer step and their FLOPs (the model's and the hardware's), the no-grad forwards included."""
    tokens = workload.per_device_batch * obj.grad_sequences * workload.seq_len * workload.gradient_accumulation_steps * world_size
    model_per_token, hw_per_token = flops_per_token(facts, workload.seq_len, workload.gradient_checkpointing, frozen)
    saved = 2 * saved_linear_params(facts, workload.adapters)  # a saved head's weight gradient: 2 FLOPs a weight a token
    model_per_token, hw_per_token = model_per_token + saved, hw_per_token + saved
    model_flops = model_per_token * tokens
    flops = hw_per_token * tokens
    # forwards without gradients (the reference's, KTO's KL): a third of 6N + 12LHQT per token
    nograd, precompute = nograd_forward_flops(facts, workload, tokens)
    model_flops += nograd
    flops += nograd
    return _StepFlops(tokens, model_per_token, hw_per_token, model_flops, flops, precompute)


def _peak(workload: Workload, gpu: GPUProfile, tf32: bool, notes: list[str]) -> tuple[str, float | None]:
    """The dtype whose peak bounds the matmuls and that peak in TFLOP/s (fp32's, noted, where the catalog lacks it)."""
    dtype = compute_dtype(workload, gpu, tf32)
    if dtype not in gpu.peak_tflops:
        notes.append(f"{gpu.name} has no {dtype} peak in the catalog; the fp32 peak is used")
        dtype = "fp32"
    return dtype, gpu.peak_tflops.get(dtype)


def _flops_formula(workload: Workload, frozen: bool) -> str:
    """The FLOPs-per-token formula the counts follow, as the section states it."""
    formula = "6N + 12LHQT per token (Kaplan et al. 2020; PaLM appendix B)"
    if workload.gradient_checkpointing:
        formula = "8N_layers + 6N_head + 16LHQT per token: full recomputation (Korthikanti et al. 2022)"
    if frozen:
        formula = "4N + 12LHQT per token: a frozen base has no weight-gradient matmuls" + (
            "; + 2N_layers + 4LHQT recomputed" if workload.gradient_checkpointing else ""
        )
        if workload.adapters is not None and workload.adapters.modules_to_save:
            formula += "; + 2N_saved: the weight gradients of the modules_to_save copies"
    return formula


def _experts_and_liger_notes(facts: ModelFacts, workload: Workload) -> list[str]:
    """The notes on a mixture of experts' FLOPs and on Liger's kernels, where they apply."""
    notes: list[str] = []
    if facts.num_experts:
        notes.append(
            f"mixture of experts: FLOPs count the {facts.active_params / 1e9:.1f}B parameters a token runs "
            f"through (top-{facts.experts_per_token} of {facts.num_experts} experts); memory counts all "
            f"{facts.n_params / 1e9:.1f}B"
        )
    if workload.liger_kernel:
        notes.append(liger.speedup_note())
    return notes


def _slowdowns(workload: Workload) -> dict[str, float]:
    """Setting -> the fraction by which it slows each step (torch_empty_cache_steps)."""
    slowdowns: dict[str, float] = {}
    if workload.torch_empty_cache_steps > 0:
        slowdowns["torch_empty_cache_steps"] = EMPTY_CACHE_SLOWDOWN
    return slowdowns


@dataclasses.dataclass(frozen=True)
class _Devices:
    """The GPUs that run the step: their profile, the data-parallel ranks, and the dtype and TFLOP/s of the peak bounding the matmuls."""

    gpu: GPUProfile
    world_size: int
    dtype: str
    peak: float


@dataclasses.dataclass(frozen=True)
class _Pricing:
    """How the step is priced: the step-time model (comm section, a calibration's scale, more terms) or a GIVEN utilisation."""

    utilisation: float | None
    assumption: str | None
    comm: Mapping[str, Any] | None
    scale: Mapping[str, float] | None
    extra_terms: Sequence[Term]


class _PricedStep(NamedTuple):
    """One step's seconds before the slowdowns, modelled or at the given utilisation, and what says so."""

    seconds: float
    saver_seconds: dict[str, float]
    model: StepTime | None
    precompute_s: float | None
    assumption: str


@dataclasses.dataclass(frozen=True)
class _Timing:
    """The step time and what follows from it: None throughout (the caller's assumption kept) where no peak is known."""

    assumption: str | None
    step_time: float | None = None
    tokens_per_second: float | None = None
    run_time: float | None = None
    utilisation: float | None = None
    # memory saver -> seconds of the step it adds (step_time/saver_terms.py)
    saver_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    model: StepTime | None = None

    def fields(self) -> dict[str, Any]:
        """The throughput section's keys for the time (the model's terms only where the model priced the step)."""
        out = {
            "utilisation": self.utilisation,
            "assumption": self.assumption,
            "saver_seconds": self.saver_seconds,
            "step_time_s": self.step_time,
            "tokens_per_second": self.tokens_per_second,
            "run_time_s": self.run_time,
        }
        if self.model is not None:
            out["step_time"] = self.model.to_dict()
        return out


def _check_arguments(world_size: int, utilisation: float | None) -> None:
    """Raise ValueError for fewer than 1 data-parallel rank or a given utilisation outside (0, 1]."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if utilisation is not None and not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation}")


def _generation(facts: ModelFacts, workload: Workload, devices: _Devices, rl_server_gpus: int | None) -> tuple[list[Term], str]:
    """The rounds' generation (grpo / rloo) as step-time terms, and the note that describes it."""
    gen = generation_time(
        facts,
        workload,
        devices.gpu,
        devices.peak * 1e12,
        constants_for(devices.gpu, devices.dtype),
        world_size=devices.world_size,
        server_gpus=rl_server_gpus,
        link_gbps=_server_link_gbps(devices.gpu),
    )
    note = (
        f"generation ({workload.generation}): {gen.round_s:.3g} s per round of {gen.sequences} sequences per engine "
        f"(prefill {gen.prefill_s:.3g} s, decode {gen.decode_s:.3g} s"
        + (f", weight sync {gen.sync_s:.3g} s" if gen.sync_s else "")
        + f"), {gen.rounds_per_step:g} round(s) per step; every completion counted at rl.max_completion_length "
        f"= {workload.rl_completion_len} tokens (an upper bound)"
    )
    return generation_terms(gen, workload), note


def _modelled_step(
    facts: ModelFacts,
    workload: Workload,
    obj: Any,
    devices: _Devices,
    comm: Mapping[str, Any] | None,
    scale: Mapping[str, float] | None,
    extra: list[Term],
) -> tuple[StepTime, float | None]:
    """The step-time model's step, the no-grad forwards priced in, and the precomputing pass's seconds (None: no such pass)."""
    gpu, dtype, peak = devices.gpu, devices.dtype, devices.peak
    # dpo / kto: the policy's shape is its sequences (2 per DPO example), and the forwards without
    # gradients (the reference's, KTO's KL) are one more term; precomputed: in the run time instead
    policy = policy_workload(workload)
    # the no-grad forwards are priced from the policy's UNSCALED terms: the calibrated model below
    # scales every device term once, these with them (built from scaled terms they were scaled twice)
    unscaled = step_time_model(facts, policy, gpu, compute_dtype=dtype, peak_tflops=peak, comm=comm, extra=extra)
    nograd_term, pass_term = nograd_forward_terms(obj, workload, unscaled.terms)
    model = (
        unscaled
        if nograd_term is None and not scale
        else step_time_model(
            facts,
            policy,
            gpu,
            compute_dtype=dtype,
            peak_tflops=peak,
            comm=comm,
            scale=scale,
            extra=[*extra, *([nograd_term] if nograd_term is not None else [])],
        )
    )
    precompute_s: float | None = None
    if pass_term is not None:  # the precomputing pass runs the same device work: the same scale, once
        precompute_s = scaled_term(pass_term, scale or {}).seconds * workload.gradient_accumulation_steps
    return model, precompute_s


def _given_step_time(
    flops: float, devices: _Devices, utilisation: float, savers: Sequence[Term], accumulation: int
) -> tuple[float, dict[str, float]]:
    """The step time at a GIVEN fraction of the peak, the savers' seconds added, and those seconds by saver."""
    step_time = flops / (devices.world_size * devices.peak * 1e12 * utilisation)
    saver_seconds = {t.name: t.seconds * (accumulation if t.per == "micro-batch" else 1) for t in savers}
    step_time += sum(saver_seconds.values())
    return step_time, saver_seconds


def _priced_step(
    facts: ModelFacts, workload: Workload, obj: Any, devices: _Devices, flops: float, pricing: _Pricing, padded_note: str | None
) -> _PricedStep:
    """The step's seconds with the memory savers' and the vision tower's terms, priced as the caller asks, and its assumption."""
    savers = saver_terms(facts, workload, devices.gpu, devices.peak * 1e12) + tower_terms(facts, workload, devices.gpu, devices.peak * 1e12)
    model: StepTime | None = None
    precompute_s: float | None = None
    if pricing.utilisation is None:
        model, precompute_s = _modelled_step(facts, workload, obj, devices, pricing.comm, pricing.scale, [*pricing.extra_terms, *savers])
        seconds = model.step_s
        saver_seconds = {t.name: model.exposed.get(t.name, 0.0) for t in savers}
        assumption = pricing.assumption or (f"step-time model, {model.constants.name} constants ({model.constants.source})")
    else:
        seconds, saver_seconds = _given_step_time(flops, devices, pricing.utilisation, savers, workload.gradient_accumulation_steps)
        assumption = pricing.assumption or f"{pricing.utilisation:.0%} of peak dense {devices.dtype} TFLOP/s (given)"
    if padded_note is not None:
        assumption = f"{assumption}; {padded_note}"
    return _PricedStep(seconds, saver_seconds, model, precompute_s, assumption)


def _timing(
    step: _PricedStep,
    counts: _StepFlops,
    devices: _Devices,
    utilisation: float | None,
    slowdowns: Mapping[str, float],
    max_steps: int | None,
    notes: list[str],
) -> _Timing:
    """The step slowed by the slowdowns, the utilisation it implies, tokens per second, and the run time with any precompute pass."""
    step_time = step.seconds
    for fraction in slowdowns.values():
        step_time *= 1 + fraction
    util = utilisation if utilisation is not None else counts.flops / (step_time * devices.world_size * devices.peak * 1e12)
    run_time = None if max_steps is None else max_steps * step_time
    if counts.precompute and max_steps is not None and run_time is not None:
        pass_s = max_steps * (
            step.precompute_s if step.precompute_s is not None else counts.precompute / (devices.world_size * devices.peak * 1e12 * util)
        )
        run_time += pass_s
        notes.append(
            f"the run time includes {pass_s:.3g} s of precomputing the reference log-probs: one "
            "reference forward per example, assuming each of the max_steps' examples once"
        )
    return _Timing(step.assumption, step_time, counts.tokens / step_time, run_time, util, step.saver_seconds, step.model)


def _objective_note(obj: Any, workload: Workload) -> str:
    """What a preference objective runs per example through the policy and the reference."""
    return (
        f"{obj.name}: {obj.grad_sequences} sequence(s) per example through the policy, forward and "
        "backward"
        + (f", {obj.reference_sequences} through the reference, forward only" if workload.reference not in ("none", "precomputed") else "")
        + (f", {obj.nograd_policy_sequences} KL sequence(s) through the policy, forward only" if obj.nograd_policy_sequences else "")
    )


def estimate_throughput(
    facts: ModelFacts,
    workload: Workload,
    gpu: GPUProfile,
    *,
    max_steps: int | None,
    world_size: int = 1,
    utilisation: float | None = None,
    assumption: str | None = None,
    tf32: bool = False,
    comm: Mapping[str, Any] | None = None,
    scale: Mapping[str, float] | None = None,
    extra_terms: Sequence[Term] = (),
    example_lengths: ExampleLengths | None = None,
    rl_server_gpus: int | None = None,
) -> ThroughputSection:
    """Tokens per optimizer step, step time and run time: the plan's throughput section
    (build adds communication, calibration and cost to it with dataclasses.replace).

    The step time is the step-time model's (plan/estimate/step_time: matmuls, attention,
    memory-bound work, optimizer, fixed costs, communication and offload, combined
    phase by phase); `step_time` carries its terms and `utilisation` is what it
    implies (FLOPs / (step time x GPUs x peak)). world_size: data-parallel ranks;
    comm: plan/estimate/comm_time.py's section, priced as the model's communication term;
    scale: a calibration's multipliers of the model's terms (plan/estimate/calibration.py);
    extra_terms: more named terms (a saver's cost, sharded adapters' gathers).
    utilisation: a GIVEN fraction of the dense peak instead of the model (step time =
    FLOPs / (utilisation x peak)); `assumption` says where it comes from.
    tf32: whether fp32 matmuls may use TF32 (the plan's training.tf32).
    example_lengths: a preference objective's examples' lengths in tokens (plan/inputs/preference_lengths.py):
    TRL pads a micro-batch to its longest sequence, not to seq_len, so the tokens, FLOPs and time are
    those of the expected padded length (plan/estimate/padding.py); memory keeps the full length.
    """
    _check_arguments(world_size, utilisation)
    notes: list[str] = []
    obj = step_objective(workload)  # dpo: 2 sequences per example; grpo / rloo: the round's no-grad forwards (spec/objectives.py)
    workload, padded_note = _padded(workload, obj, example_lengths)
    frozen = method_of(workload.adapters).frozen_base
    counts = _step_flops(facts, workload, obj, world_size, frozen)
    dtype, peak = _peak(workload, gpu, tf32, notes)
    notes.extend(_experts_and_liger_notes(facts, workload))
    slowdowns = _slowdowns(workload)

    timing = _Timing(assumption)  # no known peak: no time
    if peak:
        devices = _Devices(gpu, world_size, dtype, peak)
        if workload.generation != "none":  # grpo / rloo: the rounds' generation (step_time/generation.py)
            generation, generation_note = _generation(facts, workload, devices, rl_server_gpus)
            extra_terms = [*extra_terms, *generation]
            notes.append(generation_note)
        pricing = _Pricing(utilisation, assumption, comm, scale, extra_terms)
        step = _priced_step(facts, workload, obj, devices, counts.flops, pricing, padded_note)
        timing = _timing(step, counts, devices, utilisation, slowdowns, max_steps, notes)
    else:
        notes.append(f"{gpu.name} has no known peak TFLOP/s: no time estimate")
    if obj.is_preference:
        notes.append(_objective_note(obj, workload))
    out = {
        "tokens_per_step": counts.tokens,
        "model_flops_per_token": counts.model_per_token,
        "flops_per_token": counts.hw_per_token,
        "model_flops_per_step": counts.model_flops,
        "flops_per_step": counts.flops,
        "flops_formula": _flops_formula(workload, frozen),
        "world_size": world_size,
        "peak_dtype": dtype,
        "peak_tflops": peak,
        "slowdowns": slowdowns,
        "max_steps": max_steps,
        "notes": notes,
        **timing.fields(),
    }
    return ThroughputSection.from_dict(out)
