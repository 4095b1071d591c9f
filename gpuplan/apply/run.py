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
    from .convert import training_arguments
    from .data import prepare_data
    from .metrics import MetricsCallback
    from .model import load_model
    from .oom import injected_oom_callback
    from .tokenizer import load_tokenizer

    set_seed(int(plan.value("training.seed")))  # model init from scratch is seeded too (and the adapters)
    tokenizer = load_tokenizer(
        plan.get("model.name_or_path"),
        task=plan.value("model.task"),
        from_scratch=bool(plan.value("model.from_scratch")),
        trust_remote_code=bool(plan.value("model.trust_remote_code")),
    )
    data = prepare_data(plan, tokenizer)
    model = load_model(plan, tokenizer, data.label_names)
    if adapters.uses_adapters(plan):
        model = adapters.wrap(plan, model)  # a PeftModel: the Trainer updates only the adapters
    args = training_arguments(plan, progress=progress)
    per_step = samples_per_step(plan)
    metrics = MetricsCallback(
        plan.value("output.dir"),
        samples_per_step=per_step,
        seq_len=int(plan.value("data.seq_len")),
        on_progress=on_progress,
        echo=None if progress else echo,
        started=started,
        append=resuming,
    )
    trainer = Trainer(
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
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local paths only: never reach for the Hub
    from .checkpoints import checkpoint_problem, checkpoint_step, find_resumable, trim_metrics
    from .device import check_device, peak_memory, reset_peak_memory, world_size
    from .interrupt import ApplyInterrupted, GracefulStop
    from .oom import OOMRetry

    output_dir = plan.value("output.dir")
    adapters.check(plan)  # adapter settings refused before anything is written or loaded
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as e:
        raise ApplyError(f"output.dir: cannot create {output_dir}: {e}") from e
    device = check_device(plan)
    reset_peak_memory(device)
    if resume_from is not None:
        if not os.path.isfile(os.path.join(resume_from, "trainer_state.json")):
            raise ApplyError(f"cannot resume from {resume_from}: no trainer_state.json in it "
                             "(not a Trainer checkpoint)")
        if problem := checkpoint_problem(resume_from):
            raise ApplyError(f"cannot resume from {resume_from}: {problem}. "
                             f"Rerun with --restart, or delete {resume_from} to resume from the one before")
        if int(os.environ.get("RANK", "0")) == 0:  # rank 0 owns metrics.jsonl
            trim_metrics(output_dir, checkpoint_step(resume_from))
    state = RunState(plan, output_dir, resumed_from=resume_from)
    prepared: Prepared | None = None
    stop = GracefulStop()

    def partial_results() -> dict[str, Any]:
        res: dict[str, Any] = {"device": device, "world_size": world_size(), **peak_memory(device)}
        if prepared is not None:
            m = prepared.metrics
            res.update(train_loss_first=m.first_loss, train_loss_last=m.last_loss,
                       global_step=prepared.trainer.state.global_step)
        return res

    try:
        while True:  # one pass, plus one per out-of-memory re-plan (each to a smaller batch: it ends)
            prepared = build_trainer(plan, progress=progress, echo=echo, on_progress=state.progress,
                                     started=started, resuming=resume_from is not None,
                                     extra_callbacks=[stop.callback()])
            retry = None
            try:
                with stop:
                    output = _train(prepared.trainer, plan, resume_from)
            except OOMRetry as e:  # leave the except block first: its traceback holds the model
                retry = (e.plan, e.record, e.message)
            if retry is None:
                break
            prepared.metrics.close()
            prepared = _release(prepared, device)
            plan = retry[0]
            resume_from = find_resumable(output_dir)[0]  # this run's newest complete checkpoint
            trim_metrics(output_dir, checkpoint_step(resume_from) if resume_from else 0)  # one process here
            state.replanned(plan, {**retry[1], "resumed_from": resume_from})
            echo(retry[2] + (f"; resuming from {resume_from}" if resume_from else "; starting over"))
        trainer, metrics = prepared.trainer, prepared.metrics
        step = trainer.state.global_step
        if stop.requested and step < trainer.state.max_steps:
            ckpt = os.path.join(output_dir, f"checkpoint-{step}")
            state.progress(step, trainer.state.max_steps, step * prepared.samples_per_step)
            state.finish("interrupted", partial_results(), error=f"interrupted by the user at step {step}")
            raise ApplyInterrupted(step, ckpt if checkpoint_problem(ckpt) is None else None)
        final_dir = os.path.join(output_dir, FINAL_DIR)
        # safetensors weights + config + tokenizer; for lora/qlora peft's adapter files (adapters.py)
        trainable = adapters.trainable_params(prepared.model)  # before a merge folds the adapters away
        merged_dir = adapters.save_final(plan, trainer, final_dir)
        results = {
            "device": device,
            "world_size": world_size(),  # processes torchrun started (1 without it)
            **peak_memory(device),
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
            "final_model_dir": final_dir,
            "method": adapters.method(plan),
            "trainable_params": trainable,
            "plan_trainable_params": plan.model.get("trainable_params"),
            "merged_model_dir": merged_dir,
            "plan_allocated_peak_bytes": plan.memory.get("allocated_peak_bytes"),
            "plan_tokens_per_second": plan.throughput.get("tokens_per_second"),
            "per_device_train_batch_size": int(plan.value("training.per_device_train_batch_size")),
            "gradient_accumulation_steps": int(plan.value("training.gradient_accumulation_steps")),
        }
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
        if prepared is not None:
            prepared.metrics.close()
    if state.enabled:
        for line in summary_lines(results):
            echo(line)
    return results


def _train(trainer: Any, plan: Plan, resume_from: str | None) -> Any:
    import torch

    from .oom import replan_after_oom

    try:
        return trainer.train(resume_from_checkpoint=resume_from)
    except torch.OutOfMemoryError as e:
        raise replan_after_oom(plan, trainer.state.global_step, e) from e


def _release(prepared: Prepared, device: str) -> None:
    """Drop the Trainer and model of an attempt that ran out of memory, and their memory."""
    import gc

    del prepared
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
    return None


def _gib(n: float | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.2f} GiB"


def _ratio(measured: float | None, planned: float | None) -> str:
    if measured is None or not planned:
        return ""
    return f" ({measured / planned:.2f}x the plan)"


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The end-of-run summary: measured peak memory and throughput against the plan."""
    planned_mem = results.get("plan_allocated_peak_bytes")
    if "peak_allocated_bytes" in results:
        measured = results["peak_allocated_bytes"]
        mem = (f"peak memory: {_gib(measured)} allocated, {_gib(results['peak_reserved_bytes'])} reserved"
               f" (CUDA); plan {_gib(planned_mem)} allocated{_ratio(measured, planned_mem)}")
    else:
        measured = results.get("peak_rss_bytes")
        mem = (f"peak memory: {_gib(measured)} process RSS (CPU: includes the interpreter and data);"
               f" plan {_gib(planned_mem)} allocated")
    tps, planned_tps = results.get("tokens_per_second"), results.get("plan_tokens_per_second")
    thr = "throughput: " + (f"{tps:,.0f} tokens/s" if tps else "unknown")
    thr += f"; plan {planned_tps:,.0f} tokens/s{_ratio(tps, planned_tps)}" if planned_tps else "; plan: no estimate"
    first, last = results.get("train_loss_first"), results.get("train_loss_last")
    start, step = results.get("start_step") or 0, results["global_step"]
    span = f"over {step} steps" if not start else f"over steps {start + 1}-{step} (resumed at step {start})"
    loss = f"loss: {first:.4f} -> {last:.4f} {span}" if first is not None and last is not None else "loss: not logged"
    if results.get("eval_loss_last") is not None:
        loss += f"; eval loss {results['eval_loss_last']:.4f}"
    lines = [mem, thr, loss]
    if results.get("method", "full") != "full":
        planned = results.get("plan_trainable_params")
        lines.append(f"trainable: {results['trainable_params']:,} parameters ({results['method']} adapters"
                     + (f"; plan {planned:,})" if planned is not None else ")"))
        lines.append(f"final adapter: {results['final_model_dir']} (adapter_model.safetensors, "
                     "adapter_config.json; load with peft PeftModel.from_pretrained)")
        if results.get("merged_model_dir"):
            lines.append(f"merged model: {results['merged_model_dir']}")
        return lines
    return [*lines, f"final model: {results['final_model_dir']}"]
