"""memory.fit: check the batch arithmetic, then search the fastest split that fits.

The rule lives in the module its id names (tests/plan/test_plan_graph.py); the search it runs is
plan/fit/ (search.py, savers.py, fixes.py ...), this module only asks it and says what it chose.

Effective batch = per-device batch x accumulation x GPUs x nodes; any two given
derive the third (axolotl, Ludwig); values that do not divide are an error with the
nearest fixes. Without an effective batch the Trainer's default of 8 sequences per
device is the target (TrainingArguments.per_device_train_batch_size = 8).
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from gpuplan.errors import Diagnostic
from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.loss_chunking import unavailable as chunking_unavailable
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.fit.fix_words import no_fit_fix
from gpuplan.plan.fit.fixes import NoFit, savers_on, verified_fixes
from gpuplan.plan.fit.host_memory import host_fixes, host_limit, host_needs
from gpuplan.plan.fit.method_alternatives import adapter_alternatives
from gpuplan.plan.fit.savers import SAVERS
from gpuplan.plan.fit.search import FitProblem, FitSolution, Knobs, batch_multiple, solve, tensor_core_multiple
from gpuplan.plan.inputs.target import target_packages
from gpuplan.plan.methods import METHODS
from gpuplan.plan.rules.base_dtype import frozen_base_dtype
from gpuplan.plan.rules.common import (
    FIT_METHOD,
    FIT_PROBLEM,
    FIT_SOLUTION,
    LORA_COUNT,
    NO_FIT,
    QUANT_COMPUTE,
    TRAINER_DEFAULT_BATCH,
    world_size,
)
from gpuplan.plan.rules.distributed import sharding_candidates
from gpuplan.plan.rules.lora import adapters_for
from gpuplan.plan.rules.optimizer import default_optimizer, requested_optimizer
from gpuplan.plan.rules.preference import fit_with_reference, reference_for
from gpuplan.plan.rules.rl import rl_workload
from gpuplan.plan.rules.vision import IMAGE_PLAN
from gpuplan.plan.vision_settings import ImagePlan
from gpuplan.spec.objectives import min_per_device_batch, objective
from gpuplan.units import GIB


def _image_fields(images: ImagePlan | None) -> dict[str, Any]:
    """A VLM's images for the Workload (memory/vision.py); none for a text model."""
    if images is None:
        return {}
    t = images.tokens
    return {
        "images_per_example": images.images_per_example,
        "image_tokens": t.placeholders,
        "tower_images": t.tower_images,
        "tower_tokens": t.tower_tokens,
        "train_tower": images.train_tower,
    }


def _nearest_multiples(value: int, step: int) -> str:
    lo = (value // step) * step
    hi = lo + step
    return f"{lo} or {hi}" if lo > 0 else f"{hi}"


def ranks(ctx: Resolver, world: int) -> str:
    """The processes the batch splits over, named for the device the plan is for."""
    if ctx.gpu.is_cpu:
        return f"{world} CPU process" + ("es" if world != 1 else "")
    return f"{world} GPU(s)"


def samples_per_device(ctx: Resolver, world: int) -> int | None:
    """Samples one device sees per optimizer step; None after reporting an error."""
    e = ctx.spec("training.effective_batch_size")
    b = ctx.spec("training.per_device_train_batch_size")
    a = ctx.spec("training.gradient_accumulation_steps")
    b = None if b == "auto" else b
    a = None if a == "auto" else a
    if e is None:
        return (b or TRAINER_DEFAULT_BATCH) * (a or 1)
    if e % world:
        ctx.error(
            "training.effective_batch_size",
            f"training.effective_batch_size = {e} does not split over {ranks(ctx, world)}",
            fix=f"set training.effective_batch_size = {_nearest_multiples(e, world)}",
        )
        return None
    s = e // world
    if b is not None and a is not None and b * a != s:
        ctx.error(
            "training.effective_batch_size",
            f"training.effective_batch_size = {e} but per_device_train_batch_size x "
            f"gradient_accumulation_steps x {'processes' if ctx.gpu.is_cpu else 'GPUs'} = "
            f"{b} x {a} x {world} = {b * a * world}",
            fix=(
                f"set training.gradient_accumulation_steps = {s // b}"
                if s % b == 0
                else f"set training.effective_batch_size = {b * a * world}, or remove one of the three"
            ),
        )
        return None
    if a is not None and s % a:
        ctx.error(
            "training.gradient_accumulation_steps",
            f"training.gradient_accumulation_steps = {a} does not divide the {s} samples per "
            f"{'process' if ctx.gpu.is_cpu else 'GPU'} per step (effective_batch_size {e} / {ranks(ctx, world)})",
            fix=f'set training.gradient_accumulation_steps = "auto" or training.effective_batch_size = {_nearest_multiples(e, a * world)}',
        )
        return None
    return s


def fit(ctx: Resolver) -> None:
    world = world_size(ctx)
    s = samples_per_device(ctx, world)
    if s is None:
        ctx.set_internal(FIT_SOLUTION, None)
        ctx.set_internal(FIT_PROBLEM, None)
        ctx.set_internal(FIT_METHOD, None)
        ctx.keep("model.dtype")
        ctx.set_internal(NO_FIT, None)
        return
    problem = _fit_problem(ctx, world, s)
    user_b = problem.user_batch
    problem, tried, dtype, dtype_reason = _try_methods(ctx, problem)
    method, sol = tried[-1]
    ctx.set_internal(FIT_SOLUTION, sol)
    ctx.set_internal(FIT_PROBLEM, problem)
    ctx.set_internal(FIT_METHOD, (method, tuple(tried)))
    if dtype_reason is not None:
        ctx.resolve("model.dtype", dtype, dtype_reason)
    else:
        ctx.keep("model.dtype")
    ctx.set_internal(NO_FIT, None)
    if min(sol.per_device_batch, user_b or sol.per_device_batch) < problem.min_batch:
        _report_small_batch(ctx, problem, world)
    elif not sol.fits:
        _report_no_fit(ctx, problem, sol, method)


def _user_batch_and_accumulation(ctx: Resolver, s: int) -> tuple[Any, Any]:
    """(per-device batch, accumulation) the spec fixes, None where the search chooses."""
    b = ctx.spec("training.per_device_train_batch_size")
    a = ctx.spec("training.gradient_accumulation_steps")
    user_b = None if b == "auto" else b
    user_a = None if a == "auto" else a
    if ctx.spec("training.effective_batch_size") is None:
        user_a = user_a or 1  # no target to hold: the accumulation is what the user said, or 1
        if user_b is not None:
            user_a = s // user_b
    return user_b, user_a


def _knobs(ctx: Resolver, asked: dict, offload: bool, liger: bool) -> tuple[Knobs, frozenset[str]]:
    """(the knobs the spec fixes, the names of those it leaves "auto" for the search)."""
    gpu = ctx.gpu
    optim, _ = requested_optimizer(ctx.spec("training.optim"), gpu, asked)
    ckpt = ctx.spec("training.gradient_checkpointing")
    if offload and ckpt == "auto":
        ckpt = False  # offloading replaces checkpointing (estimate/memory/offload_activations.py); rules/offload_activations.py says so
    empty = ctx.spec("training.torch_empty_cache_steps")
    chunk = ctx.spec("training.loss_chunk_size")
    if liger or chunking_unavailable(ctx.facts.model_type, ctx.spec("model.task")):
        chunk = 0 if chunk == "auto" else chunk  # rules/loss_chunking.py says why (or refuses a size)
    auto = frozenset(
        k
        for k, v in (("optim", optim), ("gradient_checkpointing", ckpt), ("torch_empty_cache_steps", empty), ("loss_chunk_size", chunk))
        if v == "auto"
    )
    fixed = Knobs(
        gradient_checkpointing=False if ckpt == "auto" else ckpt,
        optim=default_optimizer(gpu) if optim == "auto" else optim,
        torch_empty_cache_steps=0 if empty == "auto" else (0 if gpu.is_cpu else empty),
        loss_chunk_size=0 if chunk == "auto" else chunk,
    )
    return fixed, auto


def _base_workload(ctx: Resolver, s: int, offload: bool, liger: bool) -> Workload:
    """The Workload the search prices at each batch: sequence length, dtypes, task, objective, images."""
    gpu = ctx.gpu
    bf16, fp16 = ctx.get("training.bf16"), ctx.get("training.fp16")
    obj = objective(ctx.spec("training.objective"))
    preferred = obj.is_preference  # dpo / kto (rules/preference.py)
    if obj.is_rl:  # grpo / rloo (rules/rl.py): prompt + completion tokens per completion
        seq_len = ctx.get("rl.max_prompt_length") + ctx.get("rl.max_completion_length")
    else:
        seq_len = ctx.get("preference.max_length") if preferred else ctx.spec("data.seq_len")
    base = Workload(
        per_device_batch=1,
        seq_len=seq_len,
        weight_dtype=ctx.spec("model.dtype"),
        amp="bf16" if bf16 else ("fp16" if fp16 else None),
        attn_implementation=ctx.get("model.attn_implementation"),
        task=ctx.spec("model.task"),
        num_labels=ctx.spec("model.num_labels") or 2,
        device="cpu" if gpu.is_cpu else "cuda",
        liger_kernel=liger,
        offload_activations=offload,
        objective=ctx.spec("training.objective"),
        # kto: whether the step runs the KL forwards (spec/objectives.py objective); dpo / sft: not set
        loss_type=ctx.get("preference.loss_type") if ctx.spec("training.objective") == "kto" else None,
        # chat / instruction examples packed with restarting position ids (apply/data/examples.py):
        # transformers builds a (b, 1, s, s) mask (estimate/memory/packed_mask.py); text packing does not
        packed=bool(ctx.get("data.packing")) and ctx.spec("data.format") != "text",
        **_image_fields(ctx.get(IMAGE_PLAN)),
    )
    if obj.is_rl:
        base = rl_workload(ctx, base, s)
    return base


def _fit_problem(ctx: Resolver, world: int, s: int) -> FitProblem:
    """The search's question: the workload, the memory it must fit, and what the spec fixes or leaves to it."""
    gpu = ctx.gpu
    user_b, user_a = _user_batch_and_accumulation(ctx, s)
    packages = ctx.environment.packages  # this machine's: for what gpuplan chooses itself
    asked = target_packages(ctx.spec, ctx.environment)  # for what the spec asks for
    # refused on CPU (rules/offload_activations.py): not priced there
    offload = bool(ctx.spec("training.activation_offloading")) and not gpu.is_cpu
    liger = bool(ctx.spec("training.use_liger_kernel"))  # rules/liger.py refuses it where it cannot run
    fixed, auto = _knobs(ctx, asked, offload, liger)
    base = _base_workload(ctx, s, offload, liger)
    bf16, fp16 = ctx.get("training.bf16"), ctx.get("training.fp16")
    capacity = gpu.memory_bytes
    usable = int(capacity * (1 - ctx.spec("hardware.headroom")))
    gemm = tensor_core_multiple(gpu, bool(bf16 or fp16 or base.weight_dtype != "float32"), ctx.get("training.tf32"))
    return FitProblem(
        facts=ctx.facts,
        gpu=gpu,
        base=base,
        world_size=world,
        usable_bytes=usable,
        samples_per_device=s,
        user_batch=user_b,
        user_accumulation=user_a,
        fixed=fixed,
        auto=auto,
        tensor_multiple=batch_multiple(gemm, base.seq_len * objective(base.objective).grad_sequences),
        gemm_multiple=gemm,
        eight_bit_available=bool(packages.get("bitsandbytes")) and not gpu.is_cpu,
        shardings=sharding_candidates(ctx.spec, asked, cpu=gpu.is_cpu),
        host_limit_bytes=host_limit(ctx),
        ranks_per_node=ctx.spec("hardware.count"),
        min_batch=min_per_device_batch(ctx.spec("training.objective"), ctx.spec("preference.loss_type")),
    )


def _try_methods(ctx: Resolver, problem: FitProblem) -> tuple[FitProblem, list[tuple[str, FitSolution]], str, str | None]:
    """Solve each method model.method allows until one fits: (last problem, (method, solution) tried, its model.dtype, reason)."""
    base = problem.base
    bf16 = ctx.get("training.bf16")
    asked = ctx.spec("model.method")
    shardings = problem.shardings
    tried = []
    # auto is the explicit opt-in to change what is trained: full if it fits, else lora, else qlora
    for method in tuple(METHODS) if asked == "auto" else (asked,):
        adapters = adapters_for(method, ctx)
        dtype, dtype_reason = frozen_base_dtype(ctx, method, bool(bf16), ctx.get(QUANT_COMPUTE))
        m = METHODS[method]  # a 16-bit frozen base takes the compute dtype; qlora's estimate reads the 4-bit layout
        weight_dtype = dtype if m.frozen_base and not m.quantized_base else base.weight_dtype
        problem = dataclasses.replace(
            problem,
            base=dataclasses.replace(base, adapters=adapters, reference=reference_for(ctx, method), weight_dtype=cast(Any, weight_dtype)),
        )
        engines = METHODS[method].engines  # lora/qlora shard too (estimate/memory/adapters_sharded.py)
        planned = tuple(sh for sh in shardings if sh.engine in engines)
        if planned != shardings:
            problem = dataclasses.replace(problem, shardings=planned or shardings[:1])
        problem, sol = fit_with_reference(ctx, problem, solve)  # precomputed log-probs: a saver
        tried.append((method, sol))
        if sol.fits:
            break
    return problem, tried, dtype, dtype_reason


def _report_small_batch(ctx: Resolver, p: FitProblem, world: int) -> None:
    """A per-device batch below what the objective's trainer runs (KTO: 2), with the key that made it."""
    need = p.min_batch
    name = ctx.spec("training.objective")
    why = (
        f'training.objective = "{name}" with preference.loss_type = "{ctx.get("preference.loss_type")}" needs a '
        f"per-device batch of at least {need}: its KL term pairs each completion with another example's in the "
        "same micro-batch (TRL's KTOTrainer refuses 1)"
    )
    if p.user_batch is not None:
        key, value = "training.per_device_train_batch_size", p.user_batch
        fix = f"set training.per_device_train_batch_size = {need}" + (
            f" and training.gradient_accumulation_steps = {max(1, p.samples_per_device // need)}" if p.user_accumulation is not None else ""
        )
    elif p.user_accumulation is not None:
        key, value = "training.gradient_accumulation_steps", p.user_accumulation
        fix = 'set training.gradient_accumulation_steps = "auto"'
    else:
        key, value = "training.effective_batch_size", ctx.spec("training.effective_batch_size")
        fix = f"set training.effective_batch_size = {need * world}"
    ctx.error(key, f"{key} = {value} gives a per-device batch of 1: {why}", fix=fix)


def _report_no_fit(ctx: Resolver, p: FitProblem, sol, method: str) -> None:
    gpu = ctx.gpu
    need = sol.smallest_bytes / GIB
    cap = gpu.memory_bytes / GIB
    if ctx.probe:  # only "does it fit?" was asked: no search for what would
        ctx.error("hardware.gpu", f"does not fit: needs {need:.1f} GiB on {gpu.a_name} ({p.usable_bytes / GIB:.1f} GiB usable)")
        ctx.set_internal(NO_FIT, None)
        return
    user_set = {s.knob for s in SAVERS if ctx.is_user(s.setting)}
    fixes = verified_fixes(
        p,
        user_set=user_set,
        strategy=ctx.spec("distributed.strategy"),
        count=ctx.spec("hardware.count"),
        nodes=ctx.spec("hardware.nodes"),
        headroom=ctx.spec("hardware.headroom"),
        effective_set=ctx.spec("training.effective_batch_size") is not None,
    )
    hint = ""
    if user_set:
        hint = "; " + ", ".join(f"training.{k}" for k in sorted(user_set)) + " set by the spec"
    what = "" if method == "full" else f"{method} "
    alternatives = adapter_alternatives(ctx, p) if not METHODS[method].frozen_base else []
    if alternatives:
        hint += "; what fits instead (it trains adapters, not every weight): " + "; ".join(alternatives)
    if sol.estimate.reserved_peak_bytes <= p.usable_bytes and p.host_limit_bytes is not None:
        # the GPUs hold it only with offload, and the offloaded states do not fit the host RAM known
        hint = (
            f"; {savers_on(sol, user_set)} fits the GPU ({need:.1f} GiB) but its host RAM does not: "
            f"{host_needs(ctx, sol, p)}, {p.host_limit_bytes / GIB:.0f} GiB usable (hardware.host_memory_gib)"
        ) + hint
        fixes = host_fixes(ctx, sol, p) + list(fixes)
    error = Diagnostic(
        "error",
        "hardware.gpu",
        f"{what}does not fit: needs {need:.1f} GiB at per-device batch {sol.per_device_batch} with {savers_on(sol, user_set)}; "
        f"{gpu.a_name} has {gpu.memory_label if cap != int(cap) else f'{cap:.0f} GiB'} ({p.usable_bytes / GIB:.1f} "
        f"usable with {ctx.spec('hardware.headroom'):.0%} headroom)",
        detail="peak by part: "
        + ", ".join(f"{k} {v / GIB:.1f} GiB" for k, v in sol.estimate.components.items() if v)
        + hint
        + (
            ""
            if fixes or alternatives
            else "; no single change gpuplan can check (savers, bf16 weights, a shorter seq_len, more GPUs, a larger GPU) makes it fit"
        ),
        fix=no_fit_fix(fixes, alternatives),
    )
    ctx.diagnostics.append(error)
    ctx.set_internal(NO_FIT, NoFit(method, sol, tuple(fixes), tuple(alternatives), error))


RULES = (
    Rule(
        "memory.fit",
        reads=(
            IMAGE_PLAN,
            "training.bf16",
            "training.fp16",
            "training.tf32",
            "model.attn_implementation",
            "spec:model.dtype",
            "spec:data.seq_len",
            "spec:model.task",
            "spec:model.num_labels",
            "spec:hardware.count",
            "spec:hardware.nodes",
            "spec:hardware.headroom",
            "spec:hardware.gpu",
            "spec:hardware.host_memory_gib",
            "spec:training.effective_batch_size",
            "spec:training.per_device_train_batch_size",
            "spec:training.gradient_accumulation_steps",
            "spec:training.gradient_checkpointing",
            "spec:training.optim",
            "spec:training.torch_empty_cache_steps",
            "spec:training.loss_chunk_size",
            "spec:training.use_liger_kernel",
            "spec:training.activation_offloading",
            "spec:distributed.strategy",
            "spec:distributed.fsdp_sharding",
            "spec:distributed.fsdp_cpu_offload",
            "spec:distributed.zero_stage",
            "spec:distributed.offload_optimizer",
            "spec:distributed.offload_params",
            "spec:model.method",
            LORA_COUNT,
            "lora.target_modules",
            "lora.modules_to_save",
            QUANT_COMPUTE,
            "spec:lora.r",
            "spec:lora.use_dora",
            "spec:lora.lora_dropout",
            "spec:quantization.bnb_4bit_quant_type",
            "spec:quantization.bnb_4bit_use_double_quant",
            "spec:training.objective",
            "spec:preference.loss_type",
            "preference.loss_type",
            "spec:preference.reference",
            "spec:preference.reference_model",
            "preference.max_length",
            "rl.max_prompt_length",
            "rl.max_completion_length",
            "rl.generation_backend",
            "rl.generation_batch_size",
            "rl.vllm_tensor_parallel_size",
            "rl.vllm_enable_sleep_mode",
            "rl.beta",
            "spec:rl.vllm_gpu_memory_utilization",
            "data.packing",
            "spec:data.format",
        ),
        writes=(FIT_SOLUTION, FIT_PROBLEM, FIT_METHOD, NO_FIT, "model.dtype"),
        apply=fit,
        doc="batch arithmetic checks, then the fastest split and savers that fit (plan/solve.py).",
    ),
)
