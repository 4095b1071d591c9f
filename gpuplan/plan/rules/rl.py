"""Online RL (training.objective = "grpo" | "rloo"): TRL 1.16's settings, the rewards, the prompt rows, the
generation backend, and after the fit the generation batch, the reference and vLLM's share of the GPU.

- rl.settings (before memory.fit): num_generations, beta and loss_type default to TRL 1.16's (GRPOConfig:
  8 generations, beta 0.0, loss "dapo"; RLOOConfig: 2 generations, beta 0.05, no loss_type; grpo_config.py,
  rloo_config.py); max_prompt_length defaults to data.seq_len. The generation batch is TRL's default, the
  effective batch (GRPOConfig.__post_init__: generation_batch_size = per_device_train_batch_size x processes
  x steps_per_generation, steps_per_generation = gradient_accumulation_steps), and must hold whole prompt
  groups: TRL raises "generation_batch_size (...) must be divisible by num_generations (...)" at the first
  line of the run, so the plan refuses it first. A vLLM backend needs a CUDA GPU (vLLM runs on none of the
  devices a CPU plan has): refused on CPU with that reason. Every reward is checked: a function's file
  and signature (plan/checks/rl_rewards.py, read with `ast`, never imported), the columns each reads
  (plan/checks/rl_rows.py).
- rl.generation (after memory.fit): the reference the fit priced (none at beta 0, as both trainers skip it;
  the base with adapters disabled for lora / qlora, as TRL does with peft; a frozen copy for full
  fine-tuning), vLLM's share of each GPU the fit chose, and TRL's check that a generation batch the spec
  sets splits into whole global micro-batches.
An sft / dpo / kto plan reads none of [rl]: each key is kept as the spec has it.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

from gpuplan.plan.checks.preference_rows import plain_prompt_counter, read_json_rows
from gpuplan.plan.checks.rl_rewards import RewardSignature, read_signature, signature_problems
from gpuplan.plan.checks.rl_rows import PromptReport, _rows, check_prompts
from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.generation import vllm_plan
from gpuplan.plan.estimate.memory.preference import reference_element_bytes
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.fit.search import workload as solve_workload
from gpuplan.plan.rules.common import FIT_METHOD, FIT_PROBLEM, FIT_SOLUTION, TRAINER_DEFAULT_BATCH, world_size
from gpuplan.spec.objectives import GRPO_NEEDS_SETTINGS, objective
from gpuplan.units import GIB

_SETTINGS = (
    "rl.num_generations",
    "rl.beta",
    "rl.loss_type",
    "rl.max_prompt_length",
    "rl.max_completion_length",
    "rl.temperature",
    "rl.top_p",
    "rl.generation_backend",
    "rl.vllm_tensor_parallel_size",
    "rl.vllm_enable_sleep_mode",
    "rl.vllm_server_gpus",
    "rl.rewards",
    "rl.generation_batch_size",
)
_AFTER_FIT = ("rl.vllm_gpu_memory_utilization", "rl.reference")
VLLM_BACKENDS = ("vllm-colocate", "vllm-server")


def global_samples(ctx: Resolver) -> int:
    """Sequences per optimizer step, all processes, as memory.fit splits them (rules/memory.py
    samples_per_device x world; its own errors are reported there)."""
    world = world_size(ctx)
    e = ctx.spec("training.effective_batch_size")
    if e is not None:
        return e
    b = ctx.spec("training.per_device_train_batch_size")
    a = ctx.spec("training.gradient_accumulation_steps")
    return (TRAINER_DEFAULT_BATCH if b == "auto" else b) * (1 if a == "auto" else a) * world


def settings(ctx: Resolver) -> None:
    obj = objective(ctx.spec("training.objective"))
    if not obj.is_rl:
        for key in _SETTINGS:
            ctx.keep(key)
        return
    g = ctx.spec("rl.num_generations")
    if g == "auto":
        g = obj.default_num_generations
        ctx.resolve(
            "rl.num_generations",
            g,
            f"{obj.name}: TRL's default group ({obj.config_class}.num_generations = {g}): completions sampled per prompt, "
            "whose rewards are compared with each other",
        )
    else:
        ctx.keep("rl.num_generations")
    beta = ctx.spec("rl.beta")
    if beta is None:
        beta = obj.default_beta
        why = (
            "grpo: TRL's default beta 0.0 (GRPOConfig): no KL term, so no reference model is loaded or run"
            if obj.name == "grpo"
            else f"rloo: TRL's default beta {beta} (RLOOConfig): a KL pull towards the starting policy, which needs its log-probs"
        )
        ctx.resolve("rl.beta", beta, why)
    else:
        ctx.keep("rl.beta")
    _loss(ctx, obj)
    seq = ctx.spec("data.seq_len")
    if ctx.spec("rl.max_prompt_length") is None:
        ctx.resolve(
            "rl.max_prompt_length",
            seq,
            f"prompts up to data.seq_len = {seq} tokens: TRL 1.16 does not truncate prompts, so the plan sizes the step for "
            "this many and reports longer rows",
        )
    else:
        ctx.keep("rl.max_prompt_length")
    for key in ("rl.max_completion_length", "rl.temperature", "rl.top_p", "rl.vllm_enable_sleep_mode", "rl.vllm_tensor_parallel_size"):
        ctx.keep(key)
    _backend(ctx)
    _generation_batch(ctx, g)
    _refuse_with_rl(ctx, obj)
    _rewards(ctx, obj)


def _loss(ctx: Resolver, obj) -> None:
    loss = ctx.spec("rl.loss_type")
    if not obj.loss_types:  # rloo
        if loss != "auto":
            ctx.error(
                "rl.loss_type",
                f'rl.loss_type = "{loss}": {obj.config_class} has no loss_type (RLOO\'s loss is REINFORCE with the leave-one-out baseline)',
                fix='remove rl.loss_type, or set training.objective = "grpo"',
            )
        ctx.keep("rl.loss_type")
        return
    if loss == "auto":
        ctx.resolve(
            "rl.loss_type",
            obj.default_loss,
            "TRL's default loss (GRPOConfig.loss_type): token losses normalized by the active tokens of the whole "
            "accumulated batch (the DAPO paper), no length bias",
        )
    elif loss not in obj.loss_types:
        close = difflib.get_close_matches(loss, obj.loss_types, n=1, cutoff=0.5)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        ctx.error(
            "rl.loss_type",
            f"rl.loss_type = {loss!r} is not a {obj.config_class} loss{hint}",
            detail="allowed: " + ", ".join(x for x in obj.loss_types if x not in GRPO_NEEDS_SETTINGS),
            fix=f'set rl.loss_type = "{close[0] if close and close[0] not in GRPO_NEEDS_SETTINGS else obj.default_loss}"',
        )
        ctx.keep("rl.loss_type")
    elif loss in GRPO_NEEDS_SETTINGS:
        ctx.error(
            "rl.loss_type",
            f'rl.loss_type = "{loss}" {GRPO_NEEDS_SETTINGS[loss]}',
            fix=f'set rl.loss_type = "{obj.default_loss}"',
        )
        ctx.keep("rl.loss_type")
    else:
        ctx.keep("rl.loss_type")


def _backend(ctx: Resolver) -> None:
    backend = ctx.spec("rl.generation_backend")
    ctx.keep("rl.generation_backend")
    tp = ctx.spec("rl.vllm_tensor_parallel_size")
    server = ctx.spec("rl.vllm_server_gpus")
    if backend in VLLM_BACKENDS and ctx.gpu.is_cpu:
        ctx.error(
            "rl.generation_backend",
            f'rl.generation_backend = "{backend}" on a CPU plan: vLLM generates on CUDA GPUs only (its CPU build is a separate '
            "install TRL does not drive), so this run could not start it",
            fix='set rl.generation_backend = "transformers" (model.generate on the CPU), or plan for a GPU (hardware.gpu)',
        )
    if backend == "vllm-server":
        if server is None:
            ctx.resolve(
                "rl.vllm_server_gpus",
                tp,
                f"the vLLM server (`trl vllm-serve`) holds vllm_tensor_parallel_size = {tp} GPU(s) of its own, besides the "
                "training GPUs (hardware.count)",
            )
        elif server % tp:
            ctx.error(
                "rl.vllm_server_gpus",
                f"rl.vllm_server_gpus = {server} is not a multiple of rl.vllm_tensor_parallel_size = {tp}: each server replica "
                "takes tensor-parallel-size GPUs",
                fix=f"set rl.vllm_server_gpus = {max(tp, server // tp * tp)}",
            )
            ctx.keep("rl.vllm_server_gpus")
        else:
            ctx.keep("rl.vllm_server_gpus")
        return
    if server is not None:
        ctx.error(
            "rl.vllm_server_gpus",
            f'rl.vllm_server_gpus is set but rl.generation_backend = "{backend}" runs no vLLM server',
            fix='remove rl.vllm_server_gpus, or set rl.generation_backend = "vllm-server"',
        )
    ctx.keep("rl.vllm_server_gpus")
    if backend == "vllm-colocate":
        world = world_size(ctx)
        if world % tp:
            ctx.error(
                "rl.vllm_tensor_parallel_size",
                f"rl.vllm_tensor_parallel_size = {tp} does not divide the {world} training GPUs colocated vLLM runs on",
                fix=f"set rl.vllm_tensor_parallel_size = {max(d for d in range(1, world + 1) if world % d == 0 and d <= tp)}",
            )
    elif ctx.spec("rl.vllm_enable_sleep_mode"):
        ctx.error(
            "rl.vllm_enable_sleep_mode",
            f'rl.vllm_enable_sleep_mode puts a colocated vLLM to sleep; rl.generation_backend = "{backend}" has none on the training GPUs',
            fix='remove rl.vllm_enable_sleep_mode, or set rl.generation_backend = "vllm-colocate"',
        )


def _generation_batch(ctx: Resolver, g: int) -> None:
    world = world_size(ctx)
    samples = global_samples(ctx)
    gbs = ctx.spec("rl.generation_batch_size")
    key, value = "rl.generation_batch_size", gbs
    if gbs == "auto":
        gbs = samples
        ctx.resolve(
            "rl.generation_batch_size",
            gbs,
            f"TRL's default: one generation round per optimizer step, the effective batch of {gbs} completions "
            f"= {gbs // g if gbs % g == 0 else gbs / g:g} prompts x {g} generations",
        )
        key, value = "training.effective_batch_size", ctx.spec("training.effective_batch_size")
    else:
        ctx.keep("rl.generation_batch_size")
    if gbs % g:
        lo, hi = gbs // g * g, (gbs // g + 1) * g
        near = " or ".join(str(v) for v in (lo, hi) if v > 0 and v % world == 0) or str(g * world)
        what = f"{key} = {value}" if value is not None else f"the default batch of {samples} (8 per device, the Trainer's)"
        ctx.error(
            key,
            f"{what}: the generation batch of {gbs} completions does not hold whole groups of rl.num_generations = {g} "
            f'(TRL 1.16 GRPOConfig raises "generation_batch_size ({gbs}) must be divisible by num_generations ({g})")',
            fix=f"set {key if value is not None or key == 'rl.generation_batch_size' else 'training.effective_batch_size'} = {near}",
        )


def _refuse_with_rl(ctx: Resolver, obj) -> None:
    if ctx.spec("model.task") != "causal-lm":
        ctx.error(
            "training.objective",
            f'training.objective = "{obj.name}" generates text with a causal LM, not model.task = "{ctx.spec("model.task")}"',
            fix='set model.task = "causal-lm"',
        )
    for key, what in (
        ("training.loss_chunk_size", "chunked cross-entropy"),
        ("training.use_liger_kernel", "Liger"),
        ("training.activation_offloading", "activation offloading"),
    ):
        if ctx.spec(key) not in (False, 0, None, "auto"):
            ctx.error(
                key,
                f'{key}: {what} is not planned with training.objective = "{obj.name}" (TRL\'s fused log-prob head replaces the '
                "model's loss path)",
                fix=f"remove {key}",
            )
    if ctx.spec("data.format") == "instruction":
        ctx.error(
            "data.format",
            f"{obj.name} rows are prompts (a prompt column: text or a list of messages), not instruction rows",
            fix='set data.format = "text" (plain prompts) or "chat" (lists of messages)',
        )
    if ctx.spec("data.dataset") is None and not ctx.spec("data.train_files"):
        ctx.error(
            "data.train_files",
            f"{obj.name} needs prompts to generate from, and the spec names no training data",
            fix='list a .jsonl file of {"prompt": ...} rows in data.train_files',
        )


def _rewards(ctx: Resolver, obj) -> None:
    rewards: list[dict[str, Any]] = ctx.spec("rl.rewards")
    if not rewards:
        ctx.error(
            "rl.rewards",
            f"{obj.name} scores completions with rewards, and [rl] has none",
            fix='add a reward, e.g. [[rl.rewards]] kind = "exact-match" and column = "answer"',
        )
        ctx.keep("rl.rewards")
        return
    sigs: dict[int, RewardSignature] = {}
    for i, r in enumerate(rewards):
        if r["kind"] != "function":
            continue
        path, _, name = r["function"].rpartition(":")
        got = read_signature(path, name)
        key = f"rl.rewards[{i}].function"
        if isinstance(got, RewardSignature):
            sigs[i] = got
            if got.is_async:
                ctx.note(key, f"{name} is an async def: TRL awaits it (trl/trainer/grpo_trainer.py _calculate_rewards)")
        else:
            ctx.error(key, f"{key} = {r['function']!r}: {got.summary}", fix=got.fix)
    names = [
        r.get("name") or (r["function"].rpartition(":")[2] if r["kind"] == "function" else r["kind"].replace("-", "_")) for r in rewards
    ]
    for i, n in enumerate(names):
        if names.index(n) != i:
            ctx.error(
                f"rl.rewards[{i}].name",
                f"rl.rewards[{i}] and rl.rewards[{names.index(n)}] are both named {n!r}: their metrics (rewards/{n}/mean) would mix",
                fix=f'set name = "{n}_{i}" in rl.rewards[{i}]',
            )
    columns = _check_rows(ctx, obj, rewards, sigs)
    for i, sig in sigs.items():
        for p in signature_problems(sig, os.path.basename(rewards[i]["function"].rpartition(":")[0]), columns):
            ctx.error(f"rl.rewards[{i}].function", f"rl.rewards[{i}].function: {p.summary}", fix=p.fix)
    half = ctx.spec("rl.max_completion_length") // 2
    resolved = [({**r, "target_length": max(1, half)} if r["kind"] == "length" and r["target_length"] is None else r) for r in rewards]
    if resolved != rewards:
        ctx.resolve(
            "rl.rewards",
            resolved,
            f"length penalty: target_length defaults to half of rl.max_completion_length ({max(1, half)} tokens); longer "
            "completions lose reward in proportion to the excess",
        )
    else:
        ctx.keep("rl.rewards")


def _needed(rewards: list[dict[str, Any]], sigs: dict[int, RewardSignature]) -> dict[str, list[int]]:
    """column -> the rewards (indices) that read it: exact-match's column, and a function's required
    parameters that TRL does not pass itself (they can only be columns)."""
    from gpuplan.plan.checks.rl_rewards import NOT_PASSED, TRL_KEYWORDS

    out: dict[str, list[int]] = {}
    for i, r in enumerate(rewards):
        if r["kind"] == "exact-match":
            out.setdefault(r["column"], []).append(i)
        if i in sigs:
            for p in sigs[i].required:
                if p not in TRL_KEYWORDS and p not in NOT_PASSED:
                    out.setdefault(p, []).append(i)
    return out


def _check_rows(ctx: Resolver, obj, rewards: list[dict[str, Any]], sigs: dict[int, RewardSignature]) -> tuple[str, ...] | None:
    """Check the local prompt files; the columns every row of them has (None where no file was read)."""
    needed = _needed(rewards, sigs)
    source = ctx.spec("model.name_or_path")
    byte_level = bool(ctx.spec("model.from_scratch")) or source is None
    tok_file = os.path.join(source, "tokenizer.json") if source and os.path.isdir(source) else None
    count = plain_prompt_counter(tok_file, byte_level)
    max_prompt = ctx.get("rl.max_prompt_length")
    columns: set[str] | None = None
    for key in ("data.train_files", "data.eval_files"):
        for i, path in enumerate(ctx.spec(key) or []):
            rows = read_json_rows(path) if os.path.isfile(path) else None
            if rows is None:
                continue  # missing files: plan/checks/data_files.py; parquet / csv: apply reads them
            report = check_prompts(rows, tuple(needed), max_prompt, count)
            columns = set(report.columns) if columns is None else columns & set(report.columns)
            _report(ctx, obj, f"{key}[{i}]", path, report, needed, max_prompt)
    return None if columns is None else tuple(sorted(columns))


def _report(ctx: Resolver, obj, key: str, path: str, r: PromptReport, needed: dict[str, list[int]], max_prompt: int) -> None:
    if r.no_prompt_count:
        ctx.error(
            key,
            f"{r.no_prompt_count} of {r.rows} rows in {path} have no prompt ({_rows(r.no_prompt, r.no_prompt_count)}): "
            f'{obj.config_class} generates from a "prompt" column, text or a list of messages',
            fix='give every row a non-empty "prompt" field',
        )
    if r.too_long_count:
        ctx.error(
            key,
            f"{r.too_long_count} of {r.rows} prompts in {path} are longer than rl.max_prompt_length = {max_prompt} tokens "
            f"({_rows(r.too_long, r.too_long_count)}; the longest has {r.longest}): TRL does not truncate them, so the step "
            "would run longer sequences than planned",
            fix=f"set rl.max_prompt_length = {r.longest}, or shorten those prompts",
        )
    for column, (n, first) in r.missing.items():
        readers = ", ".join(f"rl.rewards[{i}]" for i in needed[column])
        ctx.error(
            key,
            f"{n} of {r.rows} rows in {path} have no {column!r} column ({_rows(first, n)}), which {readers} reads"
            + (f" (the rows have {', '.join(r.columns)})" if r.columns else ""),
            fix=f"add a {column!r} field to every row, or point the reward at a column the rows have",
        )
    if r.unmeasured and not r.too_long_count:
        ctx.note(
            key,
            f"{r.unmeasured} of {r.rows} prompts in {path} cannot be measured here (conversational, or no tokenizer.json in the "
            f"model directory): the plan assumes each fits rl.max_prompt_length = {max_prompt} tokens",
        )


def rl_workload(ctx: Resolver, base: Workload, samples_per_device: int) -> Workload:
    """memory.fit's base workload for grpo / rloo: who generates, and how many sequences a round generates on
    each GPU (rl.generation_batch_size / world, whatever the per-device batch)."""
    backend = ctx.get("rl.generation_backend")
    share = ctx.spec("rl.vllm_gpu_memory_utilization")
    gbs = ctx.get("rl.generation_batch_size")
    world = world_size(ctx)
    return dataclasses.replace(
        base,
        generation=backend,
        rl_completion_len=ctx.get("rl.max_completion_length"),
        generation_sequences=max(1, gbs // world) if isinstance(gbs, int) else samples_per_device,
        vllm_gpu_memory_utilization=None if share == "auto" else share,
        vllm_tensor_parallel_size=ctx.get("rl.vllm_tensor_parallel_size"),
        vllm_sleep=bool(ctx.get("rl.vllm_enable_sleep_mode")) and backend == "vllm-colocate",
    )


def generation(ctx: Resolver) -> None:
    """After the fit: the reference it priced, vLLM's share it chose, the generation batch's split."""
    obj = objective(ctx.spec("training.objective"))
    sol = ctx.get(FIT_SOLUTION)
    if not obj.is_rl or sol is None:
        for key in _AFTER_FIT:
            ctx.keep(key)
        return
    problem = ctx.get(FIT_PROBLEM)
    assert problem is not None
    method = (ctx.get(FIT_METHOD) or ("full",))[0]
    run = solve_workload(problem, sol.per_device_batch, sol.knobs)
    ref = run.reference
    beta = ctx.get("rl.beta")
    if ref == "none":
        why = f"rl.beta = {beta:g}: no KL term, so {obj.trainer_class} loads no reference model and runs no reference forward"
    elif ref == "adapters-off":
        why = (
            f"{method} with rl.beta = {beta:g}: the reference log-probs come from the base with the adapters disabled "
            "(TRL's peft path), no second copy of the weights"
        )
    else:
        gib = ctx.facts.n_params * reference_element_bytes(run) / GIB
        why = (
            f"full fine-tuning with rl.beta = {beta:g}: a frozen copy of the starting weights in the policy's dtype "
            f"({gib:.1f} GiB, as TRL builds it: grpo_trainer.py dtype=self.model.dtype) for the reference log-probs"
        )
    ctx.resolve("rl.reference", ref, why)
    world = world_size(ctx)
    gbs = ctx.get("rl.generation_batch_size")
    micro = sol.per_device_batch * world
    if ctx.is_user("rl.generation_batch_size") and gbs % micro:
        ctx.error(
            "rl.generation_batch_size",
            f"rl.generation_batch_size = {gbs} does not split into global micro-batches of {micro} completions "
            f"(per-device batch {sol.per_device_batch} x {world} GPU(s)), as TRL 1.16 requires",
            fix=f"set rl.generation_batch_size = {max(micro, gbs // micro * micro)}",
        )
    if ctx.get("rl.generation_backend") == "vllm-server":
        _server(ctx, run, gbs)
    if ctx.get("rl.generation_backend") != "vllm-colocate":
        ctx.keep("rl.vllm_gpu_memory_utilization")
        return
    vp = vllm_plan(ctx.facts, run, ctx.gpu)
    share = vp.share
    if ctx.is_user("rl.vllm_gpu_memory_utilization"):
        ctx.keep("rl.vllm_gpu_memory_utilization")
        if vp.kv_bytes < vp.one_sequence_kv:
            ctx.error(
                "rl.vllm_gpu_memory_utilization",
                f"rl.vllm_gpu_memory_utilization = {share:g} gives vLLM {vp.share_bytes / GIB:.1f} GiB of {ctx.gpu.a_name}: its weights "
                f"({vp.weight_bytes / GIB:.1f} GiB) and workspace ({vp.workspace_bytes / GIB:.1f} GiB) leave no KV cache for one "
                f"sequence of {run.seq_len} tokens ({vp.one_sequence_kv / GIB:.2f} GiB); vLLM refuses to start",
                fix=f"set rl.vllm_gpu_memory_utilization = {vp.needed_share:g}",
            )
        elif vp.concurrent < vp.sequences:
            ctx.note(
                "rl.vllm_gpu_memory_utilization",
                f"vLLM's KV cache ({vp.kv_bytes / GIB:.1f} GiB) holds {vp.concurrent} of the {vp.sequences} sequences it is sent at "
                f"full length: the rest wait (vLLM schedules them as others finish); {vp.needed_share:g} would hold them all",
            )
        return
    sleep = " (asleep while training: TRL's sleep level 2 frees its weights and KV cache)" if run.vllm_sleep else ""
    ctx.resolve(
        "rl.vllm_gpu_memory_utilization",
        share,
        f"vLLM's share: {vp.share_bytes / GIB:.1f} GiB of {ctx.gpu.memory_bytes / GIB:.0f} GiB per GPU{sleep} = its weight copy "
        f"{vp.weight_bytes / GIB:.1f} GiB + workspace {vp.workspace_bytes / GIB:.1f} GiB + KV cache {vp.kv_bytes / GIB:.1f} GiB "
        f"for all {vp.sequences} sequences of a generation round at {run.seq_len} tokens at once (TRL's max_num_seqs); "
        "the smallest share in steps of 0.05 that holds them, so training keeps the rest",
    )


SERVER_SHARE = 0.9  # `trl vllm-serve --gpu_memory_utilization` default (trl/scripts/vllm_serve.py ScriptArguments)


def _server(ctx: Resolver, run: Workload, gbs: int) -> None:
    """A vLLM server on GPUs like the training ones (the plan knows no other): its weights and a round's KV cache
    at `trl vllm-serve`'s default share, per replica of vllm_tensor_parallel_size GPUs."""
    tp = max(run.vllm_tensor_parallel_size, 1)
    replicas = max(1, (ctx.get("rl.vllm_server_gpus") or tp) // tp)
    seqs = -(-gbs // replicas)
    # per GPU of a replica: vllm_plan splits the weights and each sequence's KV over tp; it holds seqs / tp of them
    server = dataclasses.replace(run, vllm_gpu_memory_utilization=SERVER_SHARE, generation_sequences=-(-seqs // tp))
    vp = vllm_plan(ctx.facts, server, ctx.gpu)
    where = f"each of the {replicas} server replica(s) ({tp} x {ctx.gpu.a_name} at vLLM's share {SERVER_SHARE:g})"
    if vp.kv_bytes < vp.one_sequence_kv:
        ctx.error(
            "rl.vllm_tensor_parallel_size",
            f"the vLLM server does not hold the model: {where} has {vp.share_bytes / GIB:.1f} GiB per GPU for "
            f"{vp.weight_bytes / GIB:.1f} GiB of weights, {vp.workspace_bytes / GIB:.1f} GiB of workspace and the KV cache",
            fix=f"set rl.vllm_tensor_parallel_size = {tp * 2} and rl.vllm_server_gpus = {tp * 2 * replicas}",
        )
        return
    ctx.note(
        "rl.vllm_server_gpus",
        f"vllm-server: {where} holds {vp.weight_bytes / GIB:.1f} GiB of weights per GPU and KV cache for {vp.concurrent * tp} "
        f"of the {seqs} sequences it generates per round at full length"
        + ("" if vp.concurrent * tp >= seqs else " (the rest wait for a slot)"),
    )


RULES = (
    Rule(
        "rl.settings",
        reads=(
            "spec:training.objective",
            *(f"spec:{k}" for k in _SETTINGS),
            "spec:data.seq_len",
            "spec:model.task",
            "spec:data.format",
            "spec:data.dataset",
            "spec:data.train_files",
            "spec:data.eval_files",
            "spec:model.name_or_path",
            "spec:model.from_scratch",
            "spec:training.loss_chunk_size",
            "spec:training.use_liger_kernel",
            "spec:training.activation_offloading",
            "spec:training.effective_batch_size",
            "spec:training.per_device_train_batch_size",
            "spec:training.gradient_accumulation_steps",
            "spec:hardware.count",
            "spec:hardware.nodes",
        ),
        writes=_SETTINGS,
        apply=settings,
        doc="grpo / rloo: TRL's defaults, the generation batch and backend, the rewards and prompt rows checked.",
    ),
    Rule(
        "rl.generation",
        reads=(
            FIT_SOLUTION,
            FIT_PROBLEM,
            FIT_METHOD,
            "spec:training.objective",
            "spec:rl.vllm_gpu_memory_utilization",
            "spec:rl.reference",
            "rl.beta",
            "rl.generation_batch_size",
            "rl.generation_backend",
            "rl.vllm_server_gpus",
            "spec:hardware.count",
            "spec:hardware.nodes",
        ),
        writes=_AFTER_FIT,
        apply=generation,
        doc="grpo / rloo after the fit: the reference, vLLM's share of the GPU, the generation batch's split.",
    ),
)
