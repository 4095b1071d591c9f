"""execute(plan): train exactly what the plan says and record what happened.

The executor reads only the Plan (DESIGN principle 1): no spec, no environment
probing beyond checking the device the plan was made for. Files written into
`output.dir`: gpuplan-state.json (state.py), metrics.jsonl (metrics.py), Trainer
checkpoints (checkpoint-N/), and the final model in safetensors under final/.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from gpuplan.plan.types import Plan
from gpuplan.render.state import summary_lines

from gpuplan.after import fingerprint, samples

from . import adapters
from .errors import ApplyError
from .state import RunState

FINAL_DIR = "final"


@dataclass
class Prepared:
    """Everything built from the plan, before training: the live objects tests inspect."""

    trainer: Any
    model: Any
    tokenizer: Any
    data: Any  # data.PreparedData
    metrics: Any  # metrics.MetricsCallback
    samples_per_step: int


def samples_per_step(plan: Plan) -> int:
    """Sequences per optimizer step on all ranks: per-device batch x accumulation x GPUs x nodes."""
    ranks = int(plan.value("hardware.count")) * int(plan.value("hardware.nodes"))
    return (
        int(plan.value("training.per_device_train_batch_size"))
        * int(plan.value("training.gradient_accumulation_steps"))
        * ranks
    )


def build_trainer(
    plan: Plan,
    *,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    on_progress: Callable[[int, int | None, int], None] | None = None,
    started: float | None = None,
    resuming: bool = False,
    extra_callbacks: list[Any] | None = None,
) -> Prepared:
    """Tokenizer, data, model, TrainingArguments and Trainer, all from the plan."""
    from transformers import PrinterCallback, Trainer, set_seed

    from .checkpoints import marker_callback
    from .convert import tracking_environment, training_arguments, uses_cpu
    from .data import prepare_data
    from .metrics import MetricsCallback
    from .model import load_model
    from .oom import injected_oom_callback
    from .tokenizer import load_tokenizer

    from gpuplan.hub.fetch import model_dir

    set_seed(int(plan.value("training.seed")))  # model init from scratch is seeded too (and the adapters)
    tokenizer = load_tokenizer(
        model_dir(plan),
        task=plan.value("model.task"),
        from_scratch=bool(plan.value("model.from_scratch")),
        trust_remote_code=bool(plan.value("model.trust_remote_code")),
    )
    say = echo or (lambda line: None)
    data = prepare_data(plan, tokenizer)
    seq_len = int(plan.value("data.seq_len"))
    say(f"data: {len(data.train):,} training sequences of {seq_len} tokens"
        + (f", {len(data.eval):,} for evaluation" if data.eval is not None else ""))
    model = load_model(plan, tokenizer, data.label_names)
    say(f"model: {model.config.model_type} with {sum(p.numel() for p in model.parameters()) / 1e6:,.1f}M "
        f"parameters, {'initialised at random' if plan.value('model.from_scratch') else 'weights loaded'}")
    if "position_ids" in data.train.column_names:
        no_cache_while_training(model)
    if adapters.uses_adapters(plan):
        model = adapters.wrap(plan, model)  # a PeftModel: the Trainer updates only the adapters
    args = training_arguments(plan, progress=progress)
    os.environ.update(tracking_environment(plan, os.environ))  # read by the Trainer's tracker callbacks
    per_step = samples_per_step(plan)
    metrics = MetricsCallback(
        plan.value("output.dir"),
        samples_per_step=per_step,
        seq_len=seq_len,
        on_progress=on_progress,
        echo=None if progress else echo,  # on a terminal the Trainer's bar shows the steps
        started=started,
        append=resuming,
    )
    trainer_cls = Trainer
    if uses_cpu(plan) and plan.get("distributed.strategy") == "fsdp":
        from .fsdp_cpu import trainer_class

        trainer_cls = trainer_class()  # accelerate drops the FSDP plugin on CPU ranks (fsdp_cpu.py)
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval,
        data_collator=data.collator,
        processing_class=tokenizer,
        callbacks=[metrics, marker_callback(), *(extra_callbacks or []),
                   *filter(None, [injected_oom_callback()])],
    )
    if not progress:
        trainer.remove_callback(PrinterCallback)  # MetricsCallback echoes one short line per log instead
    return Prepared(trainer, model, tokenizer, data, metrics, per_step)


def fetch_hub_files(plan: Plan) -> None:
    from gpuplan.hub.fetch import fetch_all
    from gpuplan.hub.resolve import HubError

    try:
        fetch_all(plan)
    except HubError as e:
        raise ApplyError(e.message) from None


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
    from .checkpoints import checkpoint_problem
    from .device import check_device, peak_memory, reset_peak_memory, world_size
    from .engine import engine_of
    from .interrupt import ApplyInterrupted, GracefulStop

    from .packages import check_packages

    check_packages(plan)  # a plan made elsewhere may need what this machine lacks: say so first
    output_dir = plan.value("output.dir")
    adapters.check(plan)  # adapter settings refused before anything is written or loaded
    samples.check(plan)
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise ApplyError(f"output.dir: cannot create {output_dir}: {e}", key="output.dir") from e
    device = check_device(plan)
    reset_peak_memory(device)
    if not progress:
        from .quiet import disable_progress_bars

        disable_progress_bars()
    if resume_from is not None:
        check_resume_point(resume_from, output_dir)
    state = RunState(plan, output_dir, resumed_from=resume_from)
    base = fingerprint.base_files(plan)  # later commands refuse a base that changed since (after/)
    attempt = Attempt()
    stop = GracefulStop()

    def partial_results() -> dict[str, Any]:
        res: dict[str, Any] = {"device": device, "world_size": world_size(), **peak_memory(device), "base_files": base}
        if attempt.prepared is not None:
            m = attempt.prepared.metrics
            res.update(train_loss_first=m.first_loss, train_loss_last=m.last_loss,
                       global_step=attempt.prepared.trainer.state.global_step)
        return res

    def build(plan: Plan, resume_from: str | None) -> Prepared:
        return build_trainer(plan, progress=progress, echo=echo, on_progress=state.progress, started=started,
                             resuming=resume_from is not None,
                             extra_callbacks=[stop.callback(), *samples.callbacks(plan, echo)])

    try:
        plan, output = train_within_memory(plan, attempt, build=build, stop=stop, state=state, device=device,
                                           resume_from=resume_from, echo=echo)
        prepared = attempt.prepared
        trainer = prepared.trainer
        step = trainer.state.global_step
        if stop.requested and step < trainer.state.max_steps:
            ckpt = os.path.join(output_dir, f"checkpoint-{step}")
            state.progress(step, trainer.state.max_steps, step * prepared.samples_per_step)
            state.finish("interrupted", partial_results(), error=f"interrupted by the user at step {step}")
            raise ApplyInterrupted(step, ckpt if checkpoint_problem(ckpt) is None else None)
        final_dir = os.path.join(output_dir, FINAL_DIR)
        restore_cache_setting(trainer.model)
        # safetensors weights + config + tokenizer (no pickle); for lora/qlora peft's adapter files (adapters.py)
        trainable = adapters.trainable_params(prepared.model)  # before a merge folds the adapters away
        merged_dir = adapters.save_final(plan, trainer, final_dir)
        samples.at_end(plan, trainer.model, prepared.tokenizer, step, echo)  # [eval] sample_prompts
        results = {
            "device": device,
            "world_size": world_size(),  # processes torchrun started (1 without it)
            "engine": engine_of(trainer.model_wrapped),  # what wrapped the model (engine.py)
            **peak_memory(device),
            **run_results(plan, prepared, output, started),
            "final_model_dir": final_dir,
            "method": adapters.method(plan),
            "trainable_params": trainable,
            "plan_trainable_params": plan.model.trainable_params,
            "merged_model_dir": merged_dir,
            "base_files": base,
        }
        if state.enabled:  # rank 0 measures for the whole run
            from .calibrate import record_measurement

            record_measurement(plan, results, echo)
        state.progress(step, trainer.state.max_steps, step * prepared.samples_per_step)
        state.finish("completed", results)
    except ApplyInterrupted:
        raise
    except KeyboardInterrupt:
        state.finish("interrupted", partial_results(), error="interrupted by the user")
        raise
    except ApplyError as e:
        state.finish("failed", partial_results(), error=e.message)
        raise
    except BaseException as e:
        state.finish("failed", partial_results(), error=f"{type(e).__name__}: {e}")
        raise
    finally:
        if attempt.prepared is not None:
            attempt.prepared.metrics.close()
    if state.enabled:
        for line in summary_lines(results):
            echo(line)
    return results


def check_resume_point(resume_from: str, output_dir: str) -> None:
    """Refuse a directory that is not a complete Trainer checkpoint; trim metrics.jsonl back to its step."""
    from .checkpoints import checkpoint_problem, checkpoint_step, trim_metrics

    if not os.path.isfile(os.path.join(resume_from, "trainer_state.json")):
        raise ApplyError(f"cannot resume from {resume_from}: no trainer_state.json in it "
                         "(not a Trainer checkpoint)")
    if problem := checkpoint_problem(resume_from):
        raise ApplyError(f"cannot resume from {resume_from}: {problem}",
                         fix=f"rerun with --restart, or delete {resume_from} to resume from the one before")
    if int(os.environ.get("RANK", "0")) == 0:  # rank 0 owns metrics.jsonl
        trim_metrics(output_dir, checkpoint_step(resume_from))


@dataclass
class Attempt:
    """The one reference to the live Trainer and model of the training attempt running now."""

    prepared: Prepared | None = None


def train_within_memory(
    plan: Plan,
    attempt: Attempt,
    *,
    build: Callable[[Plan, str | None], Prepared],
    stop: Any,
    state: RunState,
    device: str,
    resume_from: str | None,
    echo: Callable[[str], None],
) -> tuple[Plan, Any]:
    """Train; after running out of memory, re-plan to a smaller per-device batch (oom.py) and resume.

    One pass, plus one per re-plan; each goes to a smaller batch, so the loop ends.
    Returns the plan that trained and the Trainer's output; `attempt` holds its Trainer.
    """
    from .checkpoints import checkpoint_step, find_resumable, trim_metrics
    from .oom import OOMRetry

    output_dir = plan.value("output.dir")
    while True:
        attempt.prepared = build(plan, resume_from)
        retry = None
        try:
            with stop:
                return plan, _train(attempt.prepared.trainer, plan, resume_from)
        except OOMRetry as e:  # leave the except block first: its traceback holds the model
            retry = (e.plan, e.record, e.message)
        attempt.prepared.metrics.close()
        attempt.prepared = None  # the last reference to the model: now it can be freed
        _release(device)
        plan = retry[0]
        resume_from = find_resumable(output_dir)[0]  # this run's newest complete checkpoint
        trim_metrics(output_dir, checkpoint_step(resume_from) if resume_from else 0)  # one process here
        state.replanned(plan, {**retry[1], "resumed_from": resume_from})
        echo(retry[2] + (f"; resuming from {resume_from}" if resume_from else "; starting over"))


def run_results(plan: Plan, prepared: Prepared, output: Any, started: float) -> dict[str, Any]:
    """What the run measured, beside what the plan predicted."""
    trainer, metrics = prepared.trainer, prepared.metrics
    step = trainer.state.global_step
    return {
        "global_step": step,
        # tokens the ranks really consumed, all-gathered by the Trainer (multi-process runs; convert.py)
        "input_tokens_seen": trainer.state.num_input_tokens_seen or None,
        "start_step": metrics.start_step,  # > 0 when resumed from a checkpoint
        "samples_seen": step * prepared.samples_per_step,
        "tokens_per_step": metrics.tokens_per_step,
        "tokens_per_second": metrics.tokens_per_second(step),
        "steady_tokens_per_second": metrics.steady_tokens_per_second(),
        "time_to_first_step_s": metrics.time_to_first_step_s,
        "train_loss_first": metrics.first_loss,
        "train_loss_last": metrics.last_loss,
        "train_loss_mean": output.training_loss,
        "eval_loss_last": metrics.last_eval_loss,
        "runtime_s": time.perf_counter() - started,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "plan_allocated_peak_bytes": plan.memory.allocated_peak_bytes,
        "plan_tokens_per_second": plan.throughput.tokens_per_second,
        "per_device_train_batch_size": int(plan.value("training.per_device_train_batch_size")),
        "gradient_accumulation_steps": int(plan.value("training.gradient_accumulation_steps")),
    }


def _train(trainer: Any, plan: Plan, resume_from: str | None) -> Any:
    import torch

    from .oom import replan_after_oom

    try:
        return trainer.train(resume_from_checkpoint=resume_from)
    except torch.OutOfMemoryError as e:
        raise replan_after_oom(plan, trainer.state.global_step, e) from e


def _release(device: str) -> None:
    """Free the memory of an attempt that ran out of it. The caller drops its last reference
    to the Trainer and model first: while any name binds them, nothing here can free them."""
    import gc

    gc.collect()  # the model, optimizer and Trainer reference each other: only the collector frees them
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()

