"""execute(plan): train exactly what the plan says and record what happened.

The executor reads only the Plan (docs/design.md principle 1): no spec, no environment
probing beyond checking the device the plan was made for. Files written into
`output.dir`: gpuplan-state.json (state.py), metrics.jsonl (metrics.py), Trainer
checkpoints (checkpoint-N/), and the final model in safetensors under final/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.model import adapters
from gpuplan.apply.model import base_files as fingerprint
from gpuplan.apply.train import preference, rl, samples
from gpuplan.apply.train.attempts import Attempt, check_resume_point, run_results, train_within_memory
from gpuplan.errors import GpuplanError
from gpuplan.lifecycle.run_dir import FINAL_DIR, checkpoint_name
from gpuplan.lifecycle.state import RunState
from gpuplan.plan.types import Plan
from gpuplan.render.state import summary_lines

if TYPE_CHECKING:  # annotations only: the plan path imports neither torch nor transformers
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase, Trainer

    from gpuplan.apply.data.prepare import PreparedData
    from gpuplan.apply.train.metrics import MetricsCallback
    from gpuplan.apply.train.progress_line import ProgressLine
    from gpuplan.spec.objectives import Objective


@dataclass
class Prepared:
    """Everything built from the plan, before training: the live objects tests inspect."""

    trainer: Trainer  # TRL's DPOTrainer / KTOTrainer / GRPOTrainer / RLOOTrainer for those objectives (Trainer subclasses)
    model: Module  # the PreTrainedModel, or the PeftModel wrapping it under lora / qlora
    tokenizer: PreTrainedTokenizerBase
    data: PreparedData
    metrics: MetricsCallback
    samples_per_step: int
    audit: Any = None  # audit.AuditLog: the live run read back against the plan


def samples_per_step(plan: Plan) -> int:
    """Sequences per optimizer step on all ranks: per-device batch x accumulation x GPUs x nodes."""
    ranks = plan.world_size
    return plan.resolved.training.per_device_train_batch_size * plan.resolved.training.gradient_accumulation_steps * ranks


def build_trainer(
    plan: Plan,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    on_progress: Callable[[int, int | None, int], None] | None = None,
    started: float | None = None,
    resuming: bool = False,
    extra_callbacks: list[Any] | None = None,
    live: Any = None,
    audit_log: Any = None,
) -> Prepared:
    """Tokenizer, data, model, TrainingArguments and Trainer, all from the plan.

    With `progress` (a terminal) the steps show on one progress line (progress_line.py; `live`,
    made here if not given), else MetricsCallback echoes a step line per log. Either way the Trainer
    prints nothing itself: no tqdm bar (disable_tqdm, convert.py) and no PrinterCallback dicts.
    The built Trainer is audited against the plan (audit.py) here and again at on_train_begin;
    a difference raises AuditError. `audit_log` (an audit.AuditLog) receives the record."""
    from transformers import PrinterCallback, ProgressCallback, Trainer, set_seed

    from gpuplan.apply.model.vision import is_vision_language
    from gpuplan.apply.train import audit
    from gpuplan.apply.train.metrics import MetricsCallback
    from gpuplan.apply.train.progress_line import ProgressLine

    set_seed(plan.resolved.training.seed)  # model init from scratch is seeded too (and the adapters)
    vision = is_vision_language(plan)
    processor, tokenizer = _load_tokenizer(plan, vision)
    tokens = audit.tokens_of(tokenizer)  # what the live tokenizer is held to (audit.py)
    log = audit_log if audit_log is not None else audit.AuditLog()
    say = echo or (lambda line: None)
    pref = preference.objective_of(plan)
    data, seq_len = _prepare_training_data(plan, pref, vision=vision, tokenizer=tokenizer, processor=processor, say=say)
    model = _load_model(plan, tokenizer, data, vision=vision, resuming=resuming, say=say)
    model, keep_offload = _install_model_techniques(plan, model, data, pref)
    args = _training_arguments(plan, pref, progress=progress)
    per_step = samples_per_step(plan)
    metrics = MetricsCallback(
        plan.resolved.output.dir,
        samples_per_step=per_step,
        seq_len=seq_len,
        on_progress=on_progress,
        echo=None if progress else echo,  # on a terminal the progress line shows the steps
        live=(live or ProgressLine()) if progress else None,
        started=started,
        append=resuming,
    )
    from gpuplan.apply.train.fsdp_cpu import trainer_for

    trainer_cls = trainer_for(plan, Trainer)  # accelerate drops the FSDP plugin on CPU ranks (fsdp_cpu.py)
    auditor, callbacks = _wire_callbacks(plan, log, tokens, keep_offload, metrics, extra_callbacks)
    trainer, model = _construct_trainer(
        plan,
        pref,
        trainer_cls,
        model=model,
        tokenizer=tokenizer,
        processing_class=processor if vision else tokenizer,  # saved beside the weights in final/
        data=data,
        args=args,
        callbacks=callbacks,
        progress=progress,
    )
    # the Trainer's own display: `{'loss': ...}` dicts (PrinterCallback, or ProgressCallback.on_log under its bar)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    audit.audit(plan, trainer, audit.BUILD, log, tokens)
    auditor.trainer = trainer
    return Prepared(trainer, model, tokenizer, data, metrics, per_step, log)


def _load_tokenizer(plan: Plan, vision: bool) -> tuple[Any, Any]:
    """The processor (a vision-language model's AutoProcessor, else None) and the tokenizer."""
    from gpuplan.apply.data.tokenizer import load_tokenizer
    from gpuplan.hub.fetch import model_dir

    processor = None
    if vision:  # the model's AutoProcessor: image processor, tokenizer, chat template (apply/data/vision.py)
        from gpuplan.apply.data.vision import load_processor

        processor = load_processor(model_dir(plan.resolved.model.hub), plan.resolved.model.trust_remote_code)
        tokenizer = processor.tokenizer
    else:
        tokenizer = load_tokenizer(
            model_dir(plan.resolved.model.hub),
            task=plan.resolved.model.task,
            from_scratch=plan.resolved.model.from_scratch,
            trust_remote_code=plan.resolved.model.trust_remote_code,
        )
    return processor, tokenizer


def _prepare_training_data(
    plan: Plan, pref: Objective, *, vision: bool, tokenizer: Any, processor: Any, say: Callable[[str], None]
) -> tuple[PreparedData, int]:
    """The run's data for its objective and the tokens per example the metrics count, said in one line."""
    from gpuplan.apply.data.prepare import PreparedData, cache_dir, prepare_data

    if vision and pref.is_preference:
        raise ApplyError(
            f"training.objective = {pref.name!r} on a vision-language model: gpuplan trains these with sft only",
            key="training.objective",
            fix='set training.objective = "sft" (chat rows with images)',
        )
    if pref.is_preference:  # TRL tokenizes the rows itself (apply/train/preference.py)
        data = PreparedData(*preference.load_splits(plan, cache_dir(plan))[:2], None, None)
        max_length = preference.preference_run(plan).max_length
        seq_len = max_length * pref.grad_sequences  # tokens per example, at most
        if plan.throughput.tokens_per_step:  # TRL pads to the longest in the batch: the plan's expected tokens
            seq_len = min(seq_len, plan.throughput.tokens_per_step // samples_per_step(plan))  # (plan/estimate/padding.py)
        say(
            f"data: {len(data.train):,} {pref.name} examples of up to {pref.grad_sequences} x "
            f"{max_length} tokens" + (f", {len(data.eval):,} for evaluation" if data.eval is not None else "")
        )
    elif pref.is_rl:  # prompts: TRL generates the completions and tokenizes both itself (apply/train/rl.py)
        data = PreparedData(*rl.load_splits(plan, cache_dir(plan))[:2], None, None)
        run = rl.rl_run(plan)
        seq_len = int(run.sequence_length or run.max_completion_length)  # prompt + completion tokens, at most
        if plan.throughput.tokens_per_step:  # the plan's expected tokens of a step's completions
            seq_len = min(seq_len, plan.throughput.tokens_per_step // samples_per_step(plan))
        say(
            f"data: {len(data.train):,} {pref.name} prompts, {run.num_generations} completions of up to "
            f"{run.max_completion_length} tokens each" + (f", {len(data.eval):,} for evaluation" if data.eval is not None else "")
        )
    elif vision:
        from gpuplan.apply.data.vision import prepare_vision

        data = prepare_vision(plan, processor)
        seq_len = plan.resolved.data.seq_len
        say(
            f"data: {len(data.train):,} training sequences of {seq_len} tokens with their images"
            + (f", {len(data.eval):,} for evaluation" if data.eval is not None else "")
        )
    else:
        data = prepare_data(plan, tokenizer)
        seq_len = plan.resolved.data.seq_len
        say(
            f"data: {len(data.train):,} training sequences of {seq_len} tokens"
            + (f", {len(data.eval):,} for evaluation" if data.eval is not None else "")
        )
    return data, seq_len


def _load_model(plan: Plan, tokenizer: Any, data: PreparedData, *, vision: bool, resuming: bool, say: Callable[[str], None]) -> Any:
    """The plan's model, loaded and said in one line; its tied weights noted for a resume's report."""
    from gpuplan.apply.model.load import load_model

    model = load_model(plan, tokenizer, data.label_names)
    if vision:  # the model config's image token ids join the processor's in the labels' mask
        data.collator.add_config(model.config)
    if resuming:  # the Trainer loads the checkpoint's weights over these before the first step
        weights = "its weights from the checkpoint it resumes from"
    else:
        weights = "initialised at random" if plan.resolved.model.from_scratch else "weights loaded"
    say(f"model: {model.config.model_type} with {sum(p.numel() for p in model.parameters()) / 1e6:,.1f}M parameters, {weights}")
    from gpuplan.render.notices import tied_weights

    tied_weights(tied_names(model))  # a resume's "missing keys" report of a tied head is explained (render/notices.py)
    return model


def _install_model_techniques(plan: Plan, model: Any, data: PreparedData, pref: Objective) -> tuple[Any, Any]:
    """The model with the plan's techniques installed (no cache, adapters, chunked loss, offload), and the offload's callback."""
    if "position_ids" in data.train.column_names:
        no_cache_while_training(model)
    if adapters.uses_adapters(plan) and not (pref.is_preference or pref.is_rl):  # TRL wraps it for dpo / kto / grpo / rloo
        model = adapters.wrap(plan, model)  # a PeftModel: the Trainer updates only the adapters
    if chunk := plan.resolved.training.loss_chunk_size:
        from gpuplan.apply.model.chunked_loss import install

        install(model, chunk)  # the head + loss over chunks of tokens (plan/estimate/memory/loss_chunking.py)
    keep_offload = None
    if plan.resolved.training.activation_offloading:
        from gpuplan.apply.model.activation_offload import install as offload
        from gpuplan.apply.model.activation_offload import keep_installed_callback

        offload(model)  # saved tensors in pinned host RAM (plan/estimate/memory/offload_activations.py)
        keep_offload = keep_installed_callback(model)  # again after train() applies Liger, which replaces the forward
    return model, keep_offload


def _training_arguments(plan: Plan, pref: Objective, *, progress: bool) -> Any:
    """TrainingArguments for the Trainer (None where TRL builds its own), then the trackers' environment."""
    from gpuplan.apply.train.arguments import tracking_environment, training_arguments

    args = None if pref.is_preference or pref.is_rl else training_arguments(plan, progress=progress)
    os.environ.update(tracking_environment(plan, os.environ))  # read by the Trainer's tracker callbacks
    return args


def _wire_callbacks(
    plan: Plan, log: Any, tokens: Any, keep_offload: Any, metrics: MetricsCallback, extra_callbacks: list[Any] | None
) -> tuple[Any, list[Any]]:
    """The audit callback and the Trainer's callbacks, in the order their on_train_begin must run."""
    from gpuplan.apply.train import audit
    from gpuplan.apply.train.checkpoints import marker_callback
    from gpuplan.apply.train.oom import injected_oom_callback

    # the audit before metrics: its on_train_begin stops the run before metrics.jsonl is started; after
    # keep_offload, whose on_train_begin puts the offload back around the forward Liger replaced
    auditor = audit.callback(plan, log, tokens)
    callbacks = [
        *filter(None, [keep_offload]),
        auditor,
        metrics,
        marker_callback(with_metrics=plan.resolved.launch.on_bucket),
        *(extra_callbacks or []),
        *filter(None, [injected_oom_callback()]),
    ]
    return auditor, callbacks


def _construct_trainer(
    plan: Plan,
    pref: Objective,
    trainer_cls: type[Trainer],
    *,
    model: Any,
    tokenizer: Any,
    processing_class: Any,
    data: PreparedData,
    args: Any,
    callbacks: list[Any],
    progress: bool,
) -> tuple[Trainer, Any]:
    """The objective's trainer (TRL's for preference and RL, else `trainer_cls`) and the model it trains."""
    from gpuplan.apply.train.arguments import training_arguments_kwargs

    if pref.is_preference:
        trainer = preference.build(
            plan, model, tokenizer, data.train, data.eval, training_arguments_kwargs(plan, progress=progress), callbacks
        )
        model = trainer.model  # under lora / qlora: the PeftModel TRL wrapped
    elif pref.is_rl:
        trainer = rl.build(plan, model, tokenizer, data.train, data.eval, training_arguments_kwargs(plan, progress=progress), callbacks)
        model = trainer.model
    else:
        trainer = trainer_cls(
            model=model,
            args=args,
            train_dataset=data.train,
            eval_dataset=data.eval,
            data_collator=data.collator,
            processing_class=processing_class,
            callbacks=callbacks,
        )
    return trainer, model


def tied_names(model: Any) -> dict[str, str]:
    """Parameters that share one tensor (tied embeddings: lm_head.weight and model.embed_tokens.weight):
    each later name -> the first, as named_parameters(remove_duplicate=False) lists them."""
    first: dict[int, str] = {}
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def fetch_hub_files(plan: Plan) -> None:
    from gpuplan.hub.fetch import fetch_all

    fetch_all(plan.resolved.model.hub, plan.resolved.data.hub)  # a HubError is a GpuplanError: state "failed", reported with its fix


def no_cache_while_training(model: Any) -> None:
    """Packed examples (examples.py) need config.use_cache off while training.

    With use_cache on, a decoder builds a DynamicCache even in training, and
    transformers.masking_utils looks for packed sequences in the position ids only when
    there is no cache: the examples of a block would attend to each other.
    """
    if getattr(model.config, "use_cache", None):
        model.config.use_cache = False
        model.gpuplan_use_cache = True  # on the module, not the config: checkpoints save the config


def restore_cache_setting(model: Any) -> None:
    """The saved model generates with the cache setting it came with."""
    if getattr(model, "gpuplan_use_cache", False):
        model.config.use_cache = True


@dataclass(frozen=True)
class _Run:
    """What execute() set up before training, for the steps that train and record the run."""

    output_dir: str
    device: str
    state: RunState
    base: dict[str, dict[str, Any]] | None  # the base's fingerprint (apply/model/base_files.py)
    started: float  # time.perf_counter() when execute() began


def execute(
    plan: Plan,
    *,
    echo: Callable[[str], None] = print,
    progress: bool = True,
    resume_from: str | None = None,
) -> dict[str, Any]:
    """Train per the plan; return the results dict that gpuplan-state.json also holds.

    `resume_from` is a complete checkpoint directory (the CLI decides whether the plan
    may continue it); the Trainer restores model, optimizer, scheduler and step from it.
    User-fixable problems raise ApplyError (state "failed"). A first Ctrl-C saves a
    checkpoint and raises ApplyInterrupted (state "interrupted"); a second one raises
    KeyboardInterrupt. Out of memory re-plans with a smaller per-device batch (oom.py).
    """
    started = time.perf_counter()
    fetch_hub_files(plan)  # Hub ids: download what the run needs at the planned commit, once
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # from here on, local files only: never reach for the Hub
    from gpuplan.apply.launch.device import check_device, reset_peak_memory

    _check_before_run(plan)
    output_dir = plan.resolved.output.dir
    _make_output_dir(output_dir)
    device = check_device(plan)
    reset_peak_memory(device)
    live, echo = _quiet_display(progress, echo)
    run = _start_run(plan, output_dir, device, started, resume_from)
    results = _train_and_record(plan, run, resume_from=resume_from, progress=progress, echo=echo, live=live)
    if run.state.enabled:
        for line in summary_lines(results):
            echo(line)
    return results


def _check_before_run(plan: Plan) -> None:
    """Refuse what this machine or the plan's inputs cannot run, before anything is written or loaded."""
    from gpuplan.apply.launch.packages import check_packages

    if rl.uses_rl(plan):  # vLLM on a CPU is refused for what it is, before "install vllm"
        rl.check_backend(plan)
    check_packages(plan)  # a plan made elsewhere may need what this machine lacks: say so first
    adapters.check(plan)  # adapter settings refused before anything is written or loaded
    if preference.uses_preference(plan):  # every preference row usable, before anything is written
        preference.check_before_run(plan)
    if rl.uses_rl(plan):  # the backend, every prompt usable and every reward scoring the first round, before anything is written
        rl.check_before_run(plan)
    samples.check(plan)
    from gpuplan.apply.model.vision import is_vision_language

    if is_vision_language(plan):  # every image of the rows readable, before anything is written
        from gpuplan.apply.data.vision import check_before_run

        check_before_run(plan)


def _make_output_dir(output_dir: str) -> None:
    """Create output.dir; one that cannot be created is an ApplyError."""
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise ApplyError(f"output.dir: cannot create {output_dir}: {e}", key="output.dir") from e


def _quiet_display(progress: bool, echo: Callable[[str], None]) -> tuple[ProgressLine | None, Callable[[str], None]]:
    """The libraries' progress bars off; on a terminal, the progress line and an echo that prints around it."""
    from gpuplan.apply.quiet import disable_progress_bars

    disable_progress_bars()  # after the Hub downloads: from here on only gpuplan's progress, on a terminal or not
    live = None
    if progress:
        from gpuplan.apply.train.progress_line import ProgressLine

        live = ProgressLine()
        echo = live.echo(echo)  # a line apply prints never lands on the progress line
    return live, echo


def _start_run(plan: Plan, output_dir: str, device: str, started: float, resume_from: str | None) -> _Run:
    """Check the checkpoint a resume continues, send library notices to the run's log, open its state."""
    if resume_from is not None:
        check_resume_point(resume_from, output_dir)
    from gpuplan.render.notices import log_to

    log_to(output_dir)  # the run starts here: library notices go to its gpuplan-debug.log (render/notices.py)
    state = RunState(plan, output_dir, resumed_from=resume_from)
    base = fingerprint.base_files(plan)  # later commands refuse a base that changed since (after/)
    return _Run(output_dir, device, state, base, started)


def _train_and_record(
    plan: Plan, run: _Run, *, resume_from: str | None, progress: bool, echo: Callable[[str], None], live: ProgressLine | None
) -> dict[str, Any]:
    """Train within memory and record in gpuplan-state.json how the run ended: completed, interrupted or failed."""
    from gpuplan.apply.launch.device import peak_memory, world_size
    from gpuplan.apply.train.interrupt import ApplyInterrupted, GracefulStop

    state = run.state
    attempt = Attempt()
    stop = GracefulStop()
    from gpuplan.apply.train.audit import AuditLog

    audit_log = AuditLog()  # the last attempt's audit (audit.py); state.json holds it, failed or not

    def partial_results() -> dict[str, Any]:
        res: dict[str, Any] = {"device": run.device, "world_size": world_size(), **peak_memory(run.device), "base_files": run.base}
        if audit_log.stages:
            res["audit"] = audit_log.to_dict()
        if attempt.prepared is not None:
            m = attempt.prepared.metrics
            res.update(train_loss_first=m.first_loss, train_loss_last=m.last_loss, global_step=attempt.prepared.trainer.state.global_step)
        return res

    def build(plan: Plan, resume_from: str | None) -> Prepared:
        return build_trainer(
            plan,
            progress=progress,
            echo=echo,
            on_progress=state.progress,
            started=run.started,
            resuming=resume_from is not None,
            extra_callbacks=[stop.callback(), *samples.callbacks(plan, echo)],
            live=live,
            audit_log=audit_log,
        )

    try:
        plan, output = train_within_memory(
            plan, attempt, build=build, stop=stop, state=state, device=run.device, resume_from=resume_from, echo=echo
        )
        prepared = attempt.prepared
        assert prepared is not None, "train_within_memory returns with the attempt that trained"
        step = prepared.trainer.state.global_step
        _stop_if_interrupted(run, prepared, step, stop.requested, partial_results)
        results = _save_final_and_results(plan, run, prepared, output, step, audit_log=audit_log, echo=echo)
        _record_completed(plan, state, prepared, step, results, echo)
    except ApplyInterrupted:
        raise
    except KeyboardInterrupt:
        state.finish("interrupted", partial_results(), error="interrupted by the user")
        raise
    except GpuplanError as e:  # ApplyError, HubError, ...: what the user can fix
        state.finish("failed", partial_results(), error=e.message)
        raise
    except BaseException as e:
        state.finish("failed", partial_results(), error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if attempt.prepared is not None:
            attempt.prepared.metrics.close()
    return results


def _stop_if_interrupted(
    run: _Run, prepared: Prepared, step: int, stop_requested: bool, partial_results: Callable[[], dict[str, Any]]
) -> None:
    """After a first Ctrl-C ended training early: state "interrupted", and ApplyInterrupted with the checkpoint."""
    from gpuplan.apply.train.checkpoints import checkpoint_problem
    from gpuplan.apply.train.interrupt import ApplyInterrupted

    trainer = prepared.trainer
    if stop_requested and step < trainer.state.max_steps:
        ckpt = os.path.join(run.output_dir, checkpoint_name(step))
        run.state.progress(step, trainer.state.max_steps, step * prepared.samples_per_step)
        run.state.finish("interrupted", partial_results(), error=f"interrupted by the user at step {step}")
        raise ApplyInterrupted(step, ckpt if checkpoint_problem(ckpt) is None else None)


def _save_final_and_results(
    plan: Plan, run: _Run, prepared: Prepared, output: Any, step: int, *, audit_log: Any, echo: Callable[[str], None]
) -> dict[str, Any]:
    """Save the final model under final/, generate the [eval] samples, and return the completed run's results."""
    from gpuplan.apply.launch.device import peak_memory, world_size
    from gpuplan.apply.train.engine import engine_of, four_bit_weights, fsdp_units

    trainer = prepared.trainer
    final_dir = os.path.join(run.output_dir, FINAL_DIR)
    restore_cache_setting(trainer.model)
    # safetensors weights + config + tokenizer (no pickle); for lora/qlora peft's adapter files (adapters.py)
    trainable = adapters.trainable_params(prepared.model)  # before a merge folds the adapters away
    merged_dir = adapters.save_final(plan, trainer, final_dir)
    samples.at_end(plan, trainer.model, prepared.tokenizer, step, echo)  # [eval] sample_prompts
    results = {
        "device": run.device,
        "world_size": world_size(),  # processes torchrun started (1 without it)
        "engine": engine_of(trainer.model_wrapped),  # what wrapped the model (engine.py)
        "fsdp_units": fsdp_units(trainer.model_wrapped),
        **peak_memory(run.device),
        **run_results(plan, prepared, output, run.started),
        "final_model_dir": final_dir,
        "method": adapters.method(plan),
        "trainable_params": trainable,
        "plan_trainable_params": plan.model.trainable_params,
        "merged_model_dir": merged_dir,
        "base_files": run.base,
        "audit": audit_log.to_dict(),
    }
    if plan.resolved.model.method.quantized_base:
        results["four_bit_weights"] = four_bit_weights(trainer.model_wrapped)
    return results


def _record_completed(
    plan: Plan, state: RunState, prepared: Prepared, step: int, results: dict[str, Any], echo: Callable[[str], None]
) -> None:
    """Record the step-time measurement (SFT runs, rank 0) and state "completed" with the results."""
    if state.enabled and not (preference.uses_preference(plan) or rl.uses_rl(plan)):  # rank 0 measures for the whole run
        # (a dpo or grpo step's FLOPs per token are not SFT's: its runs do not calibrate the SFT step model)
        from gpuplan.apply.train.calibrate import record_measurement

        record_measurement(plan, results, echo)
    state.progress(step, prepared.trainer.state.max_steps, step * prepared.samples_per_step)
    state.finish("completed", results)
