"""Preference objectives (training.objective = "dpo" | "kto"): TRL's settings, the reference, the rows.

- preference.settings: beta, loss_type and training.learning_rate default to TRL 1.16's
  (DPOConfig / KTOConfig: beta 0.1; loss sigmoid for DPO, kto for KTO; learning_rate 1e-6, not
  the Trainer's 5e-5; a learning rate the spec sets is kept), a loss_type TRL does not name is an error with the
  closest one; max_length (prompt + answer per sequence) defaults to data.seq_len and
  max_prompt_length to max_length - 1 (a prompt must leave room for one answer token); the
  rows are checked (plan/checks/preference_rows.py).
- preference.reference: which reference the fit used (memory.fit calls `reference_for` and
  `fit_with_reference`): LoRA / QLoRA disable their adapters (peft), full fine-tuning keeps
  a frozen copy in the policy's dtype (as TRL builds it), or precomputes the reference log-probs when the copy
  would need a memory saver (the first saver: the same reference forwards, run once per
  example before training, and no copy held).
An sft plan reads none of [preference]: each key is kept as the spec has it.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from typing import Any

from gpuplan.plan.checks.preference_rows import RowReport, check_rows, plain_prompt_counter, read_json_rows, report_diagnostics
from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.estimate.memory.preference import reference_bytes, reference_element_bytes
from gpuplan.plan.estimate.memory.types import Reference
from gpuplan.plan.fit.search import workload as solve_workload
from gpuplan.plan.rules.chat_data import has_chat_template
from gpuplan.plan.rules.common import FIT_METHOD, FIT_PROBLEM, FIT_SOLUTION
from gpuplan.spec.objectives import NEEDS_LABEL_SMOOTHING, PRECOMPUTED_REFERENCE, computes_kl, objective

_KEYS = ("preference.beta", "preference.loss_type", "preference.max_length", "preference.max_prompt_length")
_WRITES = (*_KEYS, "training.learning_rate", "data.format")


def settings(ctx: Resolver) -> None:
    obj = objective(ctx.spec("training.objective"))
    if obj.is_rl:  # grpo / rloo: [rl] is rules/rl.py's; the learning rate and the prompts' format are read here
        _rl_settings(ctx, obj)
        return
    if not obj.is_preference:
        for key in _WRITES:
            ctx.keep(key)
        return
    _learning_rate(ctx, obj)
    _beta(ctx, obj)
    _loss_type(ctx, obj)
    if obj.name == "kto":
        _kto_order(ctx)
    prompt = _lengths(ctx, obj)
    _check_causal_lm(ctx, obj)
    _check_loss_path_installs(ctx, obj)
    _check_row_format(ctx, obj)
    conversational = _check_data(ctx, obj, prompt)
    _data_format(ctx, obj, conversational)


def _rl_settings(ctx: Resolver, obj) -> None:
    """The grpo / rloo settings read here: [preference] kept, the learning rate and the prompts' format."""
    for key in _KEYS:
        ctx.keep(key)
    _learning_rate(ctx, obj)
    conversational = _conversational_prompts(ctx)
    _data_format(ctx, obj, conversational)


def _data_format(ctx: Resolver, obj, conversational: int) -> None:
    """data.format: conversational rows under data.format = "text" are handled, any other format kept."""
    if conversational and ctx.spec("data.format") == "text":
        _conversational_format(ctx, obj, conversational)
    else:
        ctx.keep("data.format")


def _beta(ctx: Resolver, obj) -> None:
    """preference.beta: TRL's default unless the spec sets one."""
    beta = ctx.spec("preference.beta")
    if beta is None:
        ctx.resolve(
            "preference.beta",
            obj.default_beta,
            f"{obj.name}: TRL's default beta (trl {obj.config_class}); higher keeps the policy closer to the reference",
        )
    else:
        ctx.keep("preference.beta")


def _loss_type(ctx: Resolver, obj) -> None:
    """preference.loss_type: TRL's default for "auto", an error for a loss TRL does not name or cannot run as set."""
    loss = ctx.spec("preference.loss_type")
    if loss == "auto":
        why = (
            "the DPO loss of Rafailov et al. 2023, -log sigmoid(beta x margin), TRL's default"
            if obj.name == "dpo"
            else "the KTO loss of Ethayarajh et al. 2024, TRL's default"
        )
        ctx.resolve("preference.loss_type", obj.default_loss, why)
    elif loss not in obj.loss_types:
        close = difflib.get_close_matches(loss, obj.loss_types, n=1, cutoff=0.5)
        hint = f'; did you mean "{close[0]}"?' if close else ""
        ctx.error(
            "preference.loss_type",
            f"preference.loss_type = {loss!r} is not a {obj.config_class} loss{hint}",
            detail="allowed: " + ", ".join(obj.loss_types),
            fix=f'set preference.loss_type = "{close[0] if close else obj.default_loss}"',
        )
        ctx.keep("preference.loss_type")
    elif loss in NEEDS_LABEL_SMOOTHING:
        ctx.error(
            "preference.loss_type",
            f'preference.loss_type = "{loss}" {NEEDS_LABEL_SMOOTHING[loss]}',
            detail="TRL reads label_smoothing for it (trl/trainer/dpo_trainer.py _compute_loss); gpuplan has no key for "
            "it, so TRL's default 0.0 would run",
            fix=f'set preference.loss_type = "{obj.default_loss}"',
        )
        ctx.keep("preference.loss_type")
    else:
        ctx.keep("preference.loss_type")


def _lengths(ctx: Resolver, obj) -> int:
    """preference.max_length and max_prompt_length; returns the prompt length the rows are checked against."""
    seq = ctx.spec("data.seq_len")
    length = ctx.spec("preference.max_length")
    if length is None:
        length = seq
        ctx.resolve(
            "preference.max_length",
            seq,
            f"{obj.name}: prompt + answer in data.seq_len = {seq} tokens per sequence (TRL truncates longer ones at the end)",
        )
    else:
        ctx.keep("preference.max_length")
    prompt = ctx.spec("preference.max_prompt_length")
    if prompt is None:
        prompt = length - 1
        ctx.resolve("preference.max_prompt_length", prompt, "a prompt must leave room for at least one answer token in max_length")
    elif prompt >= length:
        ctx.error(
            "preference.max_prompt_length",
            f"preference.max_prompt_length = {prompt} leaves no answer token in max_length = {length}",
            fix=f"set preference.max_prompt_length = {length // 2}",
        )
        ctx.keep("preference.max_prompt_length")
    else:
        ctx.keep("preference.max_prompt_length")
    return prompt


def _check_causal_lm(ctx: Resolver, obj) -> None:
    """An error unless model.task is a causal LM (a preference objective trains one)."""
    if ctx.spec("model.task") != "causal-lm":
        ctx.error(
            "training.objective",
            f'training.objective = "{obj.name}" trains a causal LM, not model.task = "{ctx.spec("model.task")}"',
            fix='set model.task = "causal-lm"',
        )


def _check_loss_path_installs(ctx: Resolver, obj) -> None:
    """An error for each loss-path install the spec turns on (TRL's fused log-prob head replaces the loss path)."""
    for key, what in (
        ("training.loss_chunk_size", "chunked cross-entropy"),
        ("training.use_liger_kernel", "Liger"),
        ("training.activation_offloading", "activation offloading"),
    ):
        if ctx.spec(key) not in (False, 0, None, "auto"):  # gpuplan's installs patch the model's forward, which TRL's fused head replaces
            ctx.error(
                key,
                f'{key}: {what} is not planned with training.objective = "{obj.name}" (TRL\'s fused '
                "log-prob head replaces the model's loss path)",
                fix=f"remove {key}",
            )


def _check_row_format(ctx: Resolver, obj) -> None:
    """An error for data.format = "instruction" (preference rows are plain fields or messages)."""
    if ctx.spec("data.format") == "instruction":
        ctx.error(
            "data.format",
            f"{obj.name} rows are {' / '.join(obj.example_fields)}, not instruction rows",
            fix='set data.format = "text" (plain fields) or "chat" (lists of messages)',
        )


def _learning_rate(ctx: Resolver, obj) -> None:
    if ctx.is_user("training.learning_rate"):
        ctx.keep("training.learning_rate")
        return
    moves = "away from the reference" if obj.is_preference else "per step"
    ctx.resolve(
        "training.learning_rate",
        obj.default_learning_rate,
        f"{obj.name}: TRL's default learning rate (trl {obj.config_class}: {obj.default_learning_rate:g}); "
        f"the SFT default {ctx.spec('training.learning_rate'):g} moves the policy {moves} "
        f"{ctx.spec('training.learning_rate') / obj.default_learning_rate:.0f}x faster",
    )


def _conversational_prompts(ctx: Resolver) -> int:
    """Rows of the local files whose prompt is a list of messages (grpo / rloo: TRL renders them with the chat template)."""
    from gpuplan.plan.checks.preference_rows import _is_messages

    n = 0
    for key in ("data.train_files", "data.eval_files"):
        for path in ctx.spec(key) or []:
            rows = read_json_rows(path) if os.path.isfile(path) else None
            n += sum(1 for r in rows or [] if isinstance(r, dict) and _is_messages(r.get("prompt")))
    return n


def _conversational_format(ctx: Resolver, obj, rows: int) -> None:
    """Conversational rows under data.format = "text": TRL renders them with the tokenizer's chat template
    whatever data.format says (trl/data_utils.py maybe_apply_chat_template, when is_conversational), so the
    run is a chat run, and generate / chat / samples must prompt through the same template
    (apply/data/prompting.py reads data.format)."""
    source = ctx.spec("model.name_or_path") if not ctx.spec("model.from_scratch") else None
    if ctx.spec("data.chat_template") is None and (source is None or (os.path.isdir(source) and not has_chat_template(source))):
        where = "the byte-level tokenizer of a model trained from scratch" if source is None else f"the tokenizer in {source}"
        ctx.error(
            "data.format",
            f"{rows} {obj.name} rows are conversational (lists of messages) and {where} has no chat template to render them",
            fix='set data.format = "chat" and data.chat_template = "chatml"',
        )
        ctx.keep("data.format")
        return
    ctx.resolve(
        "data.format",
        "chat",
        f"{rows} {obj.name} rows are conversational (lists of messages): TRL renders them with the chat template, "
        "so generate, chat and the samples prompt through it too",
    )


# datasets' text builder (apply/data/prepare.py BUILDERS) reads these as one "text" field per line: no preference
# row can be written in them, and apply refuses them (apply/train/preference.py check_rows: every row "has no prompt / ...").
PLAIN_TEXT = (".txt", ".text")


def _plain_text_file(ctx: Resolver, obj, key: str, path: str) -> None:
    fields = " / ".join(obj.example_fields)
    ctx.error(
        key,
        f'{key}: {path} is a plain-text file (datasets reads each line as one "text" field), so it holds no '
        f"{obj.name} rows: a {obj.name} row has {fields}",
        fix=f'list a .jsonl file of {fields} rows in {key.split("[")[0]}, or set training.objective = "sft" to train on the text',
    )


def _check_data(ctx: Resolver, obj, max_prompt: int) -> int:
    """Report the unusable rows of the local files; returns how many rows are conversational."""
    conversational = 0
    source = ctx.spec("model.name_or_path")
    byte_level = bool(ctx.spec("model.from_scratch")) or source is None
    tok_file = os.path.join(source, "tokenizer.json") if source and os.path.isdir(source) else None
    count = plain_prompt_counter(tok_file, byte_level)
    for key in ("data.train_files", "data.eval_files"):
        for i, path in enumerate(ctx.spec(key) or []):
            if os.path.splitext(path)[1].lower() in PLAIN_TEXT:
                _plain_text_file(ctx, obj, f"{key}[{i}]", path)
                continue
            rows = read_json_rows(path) if os.path.isfile(path) else None
            if rows is None:
                continue  # missing files: plan/checks/data_files.py; other formats: apply checks them
            report = check_rows(rows, obj, max_prompt, count)
            conversational += report.conversational
            ctx.diagnostics.extend(report_diagnostics(report, f"{key}[{i}]", path, obj))
            if report.paired and not report.unusable:
                ctx.note(f"{key}[{i}]", paired_note(report, path))
            if report.prompts_unmeasured and not report.unusable:
                ctx.note(
                    f"{key}[{i}]",
                    f"{report.prompts_unmeasured} of {report.rows} prompts in {path} cannot be "
                    "measured here (conversational, or no tokenizer.json in the model "
                    "directory): apply measures them against preference.max_prompt_length "
                    "before it writes anything",
                )
    return conversational


def _kto_order(ctx: Resolver) -> None:
    """How a KTO run orders its rows (apply/train/preference.py train_sampling, shuffled_rows)."""
    seed = ctx.spec("training.seed")
    if computes_kl("kto", ctx.get("preference.loss_type")):
        ctx.note(
            "training.seed",
            f"kto: the rows are shuffled once with training.seed = {seed} before TRL batches them, and every epoch "
            "runs those batches in that order: TRL's KTOTrainer pairs each KL completion with another of the same "
            "fixed batch, so it reads them sequentially (trl/trainer/kto_config.py train_sampling_strategy, "
            "kto_trainer.py _prepare_dataset)",
        )
    else:
        ctx.note(
            "training.seed",
            f"kto with apo_zero_unpaired (no KL term): the rows are sampled at random with training.seed = {seed}, "
            'reshuffled every epoch (train_sampling_strategy = "random"; KTOConfig\'s default "sequential" reads '
            "them in file order)",
        )


def paired_note(report: RowReport, path: str) -> str:
    """What KTO does with prompt / chosen / rejected rows (plan/checks/preference_rows.py)."""
    return (
        f"{report.rows} rows in {path} are prompt / chosen / rejected pairs: KTO trains on them unpaired, "
        f"{report.examples} labelled completions (each chosen one with label true, each rejected one false), as "
        "TRL's KTOTrainer unpairs them (trl/trainer/kto_trainer.py _prepare_dataset, trl/data_utils.py "
        "unpair_preference_dataset); apply unpairs them with that function, then shuffles them"
    )


def reference_for(ctx: Resolver, method: str) -> Reference:
    """The Workload's reference for `method` before any saver: none, adapters-off, copy or precomputed."""
    obj = objective(ctx.spec("training.objective"))
    if obj.is_rl:  # rules/rl.py: the reference exists when beta != 0 (both trainers skip it at 0.0)
        if ctx.get("rl.beta") == 0:
            return "none"
        return "adapters-off" if method in ("lora", "qlora") else "copy"
    if not obj.needs_reference:
        return "none"
    want = ctx.spec("preference.reference")
    if want == "precomputed":
        return "precomputed"
    if want == "model" or ctx.spec("preference.reference_model") is not None:
        return "copy"  # a separate frozen model, counted as the policy's architecture in the compute dtype
    return "adapters-off" if method in ("lora", "qlora") else "copy"


def fit_with_reference(ctx: Resolver, problem: Any, solve: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Solve; with reference = "auto", a full fine-tune that needs any saver (or does not fit) with a
    reference copy precomputes the reference log-probs instead when that fits with fewer savers:
    it runs the same reference forwards, once per example before training, so it is the cheapest
    saver. Returns (problem, solution)."""
    sol = solve(problem)
    base = problem.base
    chosen = ctx.spec("preference.reference") != "auto" or ctx.spec("preference.reference_model") is not None
    # grpo / rloo: TRL 1.16's online trainers have no precomputed reference (the policy changes every round)
    if base.reference != "copy" or chosen or (sol.fits and not sol.savers) or base.generation != "none":
        return problem, sol
    other = dataclasses.replace(problem, base=dataclasses.replace(base, reference="precomputed"))
    alt = solve(other)
    if alt.fits and (not sol.fits or len(alt.savers) < len(sol.savers)):
        # what the copy would take on each GPU with the solved sharding (TRL shards it under ZeRO-3)
        copy_run = dataclasses.replace(solve_workload(other, alt.per_device_batch, alt.knobs), reference="copy")
        alt = dataclasses.replace(
            alt,
            savers=(PRECOMPUTED_REFERENCE, *alt.savers),
            saved_bytes={**alt.saved_bytes, PRECOMPUTED_REFERENCE: reference_bytes(ctx.facts, copy_run)[0]},
        )
        return other, alt
    return problem, sol


def reference(ctx: Resolver) -> None:
    obj = objective(ctx.spec("training.objective"))
    sol = ctx.get(FIT_SOLUTION)
    method = (ctx.get(FIT_METHOD) or ("full",))[0]
    if not obj.needs_reference or sol is None:
        ctx.keep("preference.reference")
        return
    problem = ctx.get(FIT_PROBLEM)
    assert problem is not None  # memory.fit sets it beside its solution
    base = problem.base
    ref = base.reference
    gib = ctx.facts.n_params * reference_element_bytes(base) / 2**30
    run = dataclasses.replace(solve_workload(problem, sol.per_device_batch, sol.knobs), reference="copy")
    per_gpu, on_host = reference_bytes(ctx.facts, run)
    sharded = ""
    if per_gpu + on_host < ctx.facts.n_params * reference_element_bytes(run):  # trl/models/utils.py prepare_deepspeed / prepare_fsdp
        engine = "DeepSpeed ZeRO-3" if run.engine == "deepspeed" else "FSDP full_shard"
        where = f"{per_gpu / 2**30:.2f} GiB per GPU" + (f" ({on_host / 2**30:.2f} GiB offloaded to host RAM)" if on_host else "")
        sharded = f", sharded over {run.shard_world_size} GPUs as TRL shards it under {engine}: {where}"
    asked = ctx.spec("preference.reference")
    if asked == "auto" and ctx.spec("preference.reference_model") is not None:
        asked = "model"  # setting the model chooses it
    if ref == "adapters-off":
        why = f"{method}: the reference is the base with adapters disabled (peft), no second copy of the weights"
    elif ref == "precomputed":
        why = "precomputed: one reference forward per example before training, no reference in memory"
        if asked == "auto":
            why = (
                f"a frozen reference copy ({gib:.1f} GiB){sharded} would need more memory savers: the reference log-probs "
                "are computed once per example before training instead, and no copy is held"
            )
    elif asked == "model":
        why = (
            f"a separate frozen model ({ctx.spec('preference.reference_model')}), counted as the policy's "
            f"architecture in {'the policy' if method == 'full' else 'the compute'} dtype ({gib:.1f} GiB){sharded}"
        )
    else:
        why = f"full fine-tuning: a frozen copy of the starting weights in the policy's dtype ({gib:.1f} GiB){sharded}"
    path = ctx.spec("preference.reference_model")
    if asked == "model" and not os.path.isfile(os.path.join(path, "config.json")):
        ctx.error(
            "preference.reference_model",
            f"preference.reference_model = {path!r}: no model directory with a config.json there",
            fix="point it at a local model directory (config.json + safetensors), "
            'relative to the spec, or set preference.reference = "auto"',
        )
    ctx.resolve("preference.reference", {"copy": "model" if asked == "model" else "copy"}.get(ref, ref), why)
    b = sol.per_device_batch
    if obj.grad_sequences > 1:
        ctx.note(
            "training.objective",
            f"{obj.name}: each example is a chosen and a rejected sequence in one forward: per-device batch "
            f"{b} examples = {b * obj.grad_sequences} sequences of {base.seq_len} tokens",
        )


RULES = (
    Rule(
        "preference.settings",
        reads=(
            "spec:training.objective",
            "spec:training.learning_rate",
            "spec:preference.beta",
            "spec:preference.loss_type",
            "spec:preference.max_length",
            "spec:preference.max_prompt_length",
            "spec:data.seq_len",
            "spec:model.task",
            "spec:data.format",
            "spec:data.chat_template",
            "spec:data.train_files",
            "spec:data.eval_files",
            "spec:model.name_or_path",
            "spec:model.from_scratch",
            "spec:training.loss_chunk_size",
            "spec:training.use_liger_kernel",
            "spec:training.activation_offloading",
            "spec:training.seed",
        ),
        writes=_WRITES,
        apply=settings,
        doc="dpo / kto: TRL's beta, loss and learning-rate defaults, max lengths, the rows checked.",
    ),
    Rule(
        "preference.reference",
        reads=(
            FIT_SOLUTION,
            FIT_METHOD,
            FIT_PROBLEM,
            "spec:training.objective",
            "spec:preference.reference",
            "spec:preference.reference_model",
        ),
        writes=("preference.reference",),
        apply=reference,
        doc="the reference the fit used: adapters disabled, a frozen copy, or precomputed log-probs.",
    ),
)
