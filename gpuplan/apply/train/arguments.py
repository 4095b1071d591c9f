"""Plan -> TrainingArguments keyword arguments and torch dtypes.

This is the ONLY place where plan values become TrainingArguments fields or torch
dtypes (docs/design.md: "dtypes stay strings until the one place they are used"). The rest of
`apply` passes these results along and never reads a `training.*` precision key itself.

Field names follow transformers 5.24 `training_args.py`:
- gradient checkpointing is `activation_checkpointing` (the `gradient_checkpointing`
  field is a deprecated alias that warns);
- `warmup_ratio` is gone: `warmup_steps` takes an int (steps) or a float in [0, 1);
- `torch_empty_cache_steps` must be None or a positive int ("0 = off" is None here);
- setting `torch_compile_backend` alone turns compile on, so it is passed only with
  `torch_compile = true`;
- `max_steps = -1` means "use num_train_epochs".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.errors import ApplyError
from gpuplan.plan.types import Plan

# Weight dtype names accepted in `model.dtype`; torch attribute names.
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def uses_cpu(plan: Plan) -> bool:
    """True when the plan was made for hardware "cpu" (GPUProfile.is_cpu)."""
    return plan.hardware.is_cpu


def has_eval(plan: Plan) -> bool:
    return plan.resolved.data.has_eval


def torch_dtype(plan: Plan) -> Any:
    """The torch dtype to load the weights in (`model.dtype`)."""
    import torch

    return getattr(torch, _TORCH_DTYPES[plan.resolved.model.dtype])


def training_arguments_kwargs(plan: Plan, *, progress: bool = True) -> dict[str, Any]:
    """Keyword arguments for `transformers.TrainingArguments`, all read from the plan.

    `progress` is an execution option (the terminal), not a plan value; the Trainer's
    tqdm bar is off either way (on a terminal apply draws its own line, progress_line.py).
    """
    t = plan.resolved.training
    compile_on = t.torch_compile
    eval_on = has_eval(plan)
    kwargs: dict[str, Any] = {
        "output_dir": plan.resolved.output.dir,
        "use_cpu": uses_cpu(plan),
        # batch (effective = per-device x accumulation x GPUs x nodes, resolved by the plan)
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "per_device_eval_batch_size": t.per_device_eval_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        # memory savers
        "activation_checkpointing": t.gradient_checkpointing,
        "torch_empty_cache_steps": t.torch_empty_cache_steps or None,
        "use_liger_kernel": t.use_liger_kernel,  # plan/estimate/memory/liger.py
        # precision
        "bf16": t.bf16,
        "fp16": t.fp16,
        "tf32": t.tf32,
        # optimizer and schedule
        "optim": t.optim,
        "learning_rate": t.learning_rate,
        "weight_decay": t.weight_decay,
        "max_grad_norm": t.max_grad_norm,
        "lr_scheduler_type": t.lr_scheduler_type,
        "warmup_steps": t.warmup,  # the steps, or warmup_ratio as the float in [0, 1) that 5.24 reads as a ratio
        "max_steps": t.max_steps if t.max_steps is not None else -1,
        "num_train_epochs": t.num_train_epochs,
        "seed": t.seed,
        # data preloading
        "dataloader_pin_memory": t.dataloader_pin_memory,
        "dataloader_num_workers": t.dataloader_num_workers,
        # compile
        "torch_compile": compile_on,
        "torch_compile_backend": t.torch_compile_backend if compile_on else None,
        "torch_compile_mode": t.torch_compile_mode if compile_on else None,
        # logging, checkpoints, eval
        "logging_steps": t.logging_steps,
        "logging_first_step": True,  # the first loss is the baseline the summary compares against
        "save_steps": t.save_steps,
        "save_total_limit": t.save_total_limit,
        "eval_strategy": "steps" if eval_on else "no",
        "eval_steps": (t.eval_steps or t.logging_steps) if eval_on else None,
        # experiment trackers: the Trainer's own integrations (tracking_environment says where they write)
        "report_to": t.report_to if isinstance(t.report_to, str) else list(t.report_to),
        "run_name": t.run_name,
        "disable_tqdm": True,  # on a terminal apply draws its own progress line (progress_line.py)
    }
    kwargs.update(distributed_kwargs(plan))
    from gpuplan.apply.model.vision import is_vision_language

    if is_vision_language(plan):
        # the rows carry their text and image files to the collator (apply/data/vision.py), columns
        # the model's forward does not name: the Trainer would drop them
        kwargs["remove_unused_columns"] = False
    if "fsdp" in kwargs and kwargs["activation_checkpointing"]:
        # FSDP's own activation checkpointing: the Trainer's argument wraps the recomputation
        # outside the FSDP units and adds an all-gather per unit in backward (transformers 5.24
        # training_args.py warning; issue 30404); the Trainer refuses both on at once.
        kwargs["activation_checkpointing"] = False
        kwargs["fsdp_config"]["activation_checkpointing"] = True
    return kwargs


def tracking_environment(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    """Environment variables that point the file-based trackers inside output.dir.

    The Trainer's callbacks read their locations from the environment only
    (transformers integrations/integration_utils.py: TensorBoardCallback reads
    TENSORBOARD_LOGGING_DIR, else output_dir/runs/<date_host>; MLflowCallback reads
    MLFLOW_TRACKING_URI, else mlflow's default store under the working directory).
    TensorBoard always logs in output.dir/tensorboard; MLflow uses a local file store in
    output.dir/mlruns unless the user's environment names a tracking server. MLflow 3
    refuses the file store unless MLFLOW_ALLOW_FILE_STORE=true ("maintenance mode"); it
    still writes and reads it, and it needs no database or server.
    """
    import os

    from gpuplan.spec.trackers import MLFLOW_DIR, TENSORBOARD_DIR

    names = plan.resolved.training.trackers
    out_dir = os.path.abspath(plan.resolved.output.dir)
    env: dict[str, str] = {}
    if "tensorboard" in names or "all" in names:
        env["TENSORBOARD_LOGGING_DIR"] = os.path.join(out_dir, TENSORBOARD_DIR)
    if ("mlflow" in names or "all" in names) and not environ.get("MLFLOW_TRACKING_URI"):
        env["MLFLOW_TRACKING_URI"] = "file:" + os.path.join(out_dir, MLFLOW_DIR)
        env["MLFLOW_ALLOW_FILE_STORE"] = environ.get("MLFLOW_ALLOW_FILE_STORE", "true")
    return env


def distributed_kwargs(plan: Plan) -> dict[str, Any]:
    """Fields for several processes (hardware.count x hardware.nodes > 1) and `distributed.strategy`.

    torchrun sets the ranks (apply/launch/torchrun.py); these fields only choose the engine:
    - every multi-process run: include_num_input_tokens_seen = "all", so the Trainer
      all-gathers the tokens each rank really consumed (trainer.py _track_num_input_tokens)
      and the run records the samples seen per optimizer step on all ranks together;
    - "cpu": ddp_backend = "gloo" (NCCL is CUDA only; torch.distributed backends table);
    - DDP: ddp_find_unused_parameters = False. The Trainer's default is True without
      gradient checkpointing (training_args.py docstring), which makes DDP walk the autograd
      graph after every backward to find parameters without gradients; every parameter of
      the models apply builds takes part in the loss, so the walk is pure overhead. A model
      with unused parameters fails loudly in DDP ("Expected to have finished reduction").
    - FSDP: transformers 5.24's `fsdp=True` + `fsdp_config` version 2 (FSDP2:
      reshard_after_forward=True is full_shard, False is shard_grad_op). FSDP2 always keeps
      the original parameters, so torch.compile needs no use_orig_params (accelerate
      dataclasses.py: "use_orig_params is obsolete in FSDP2"). With accumulation, sync_each_batch
      reduce-scatters every micro-batch: the plan's memory assumes it (gpuplan/plan/estimate/memory/sharding.py
      FSDP_SYNC_EACH_BATCH: sharded gradients between micro-batches, not 2P unsharded ones).
    - DeepSpeed: a ZeRO config whose "auto" values the Trainer fills from TrainingArguments
      (transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig). With optimizer
      offload an "optimizer" section (AdamW, all "auto") lets DeepSpeed build its CPU Adam:
      DeepSpeed 0.19 refuses a client optimizer with offload unless zero_force_ds_cpu_optimizer
      is false (runtime/engine.py), so training.optim is then DeepSpeed's AdamW.
    """
    strategy = plan.resolved.distributed.strategy
    world = plan.world_size
    kwargs: dict[str, Any] = {}
    if world > 1:
        kwargs["include_num_input_tokens_seen"] = "all"
        if uses_cpu(plan):
            kwargs["ddp_backend"] = "gloo"
    if strategy in ("none", "ddp"):
        if world > 1:
            kwargs["ddp_find_unused_parameters"] = False
        return kwargs
    return {**kwargs, **_sharded_kwargs(plan, strategy)}


def _sharded_kwargs(plan: Plan, strategy: str) -> dict[str, Any]:
    d = plan.resolved.distributed
    if strategy == "fsdp":
        sharding = d.fsdp_sharding
        if sharding not in ("full_shard", "shard_grad_op"):
            raise ApplyError(
                f"distributed.fsdp_sharding = {sharding!r} is not applied by gpuplan yet",
                key="distributed.fsdp_sharding",
                fix='use "full_shard" or "shard_grad_op"',
            )
        out: dict[str, Any] = {
            "fsdp": True,
            "fsdp_config": {
                "version": 2,
                "reshard_after_forward": sharding == "full_shard",
                "cpu_offload": d.fsdp_cpu_offload,
            },
        }
        if plan.resolved.training.gradient_accumulation_steps > 1:
            out["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
        return out
    if strategy == "deepspeed":
        stage = d.zero_stage
        if stage is None:
            raise ApplyError(
                "distributed.zero_stage = 'auto': the plan must resolve it to 1, 2 or 3",
                key="distributed.zero_stage",
                fix="re-run `gpuplan plan` to resolve it",
            )
        zero: dict[str, Any] = {"stage": stage}
        if d.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if d.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        config: dict[str, Any] = {}
        if d.offload_optimizer:
            config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}
        return {
            "deepspeed": {
                **config,
                "zero_optimization": zero,
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "train_batch_size": "auto",
                "gradient_clipping": "auto",
                "bf16": {"enabled": "auto"},
                "fp16": {"enabled": "auto"},
            }
        }
    raise ApplyError(
        f"distributed.strategy = {strategy!r} is not one of none, ddp, fsdp, deepspeed",
        key="distributed.strategy",
        fix="re-run `gpuplan plan` to resolve it",
    )


def training_arguments(plan: Plan, *, progress: bool = True) -> Any:
    """`TrainingArguments` built from the plan; its own refusals become an ApplyError with a next step."""
    import transformers
    from transformers import TrainingArguments

    try:
        return TrainingArguments(**training_arguments_kwargs(plan, progress=progress))
    except (ValueError, ImportError) as e:
        raise ApplyError(
            f"the plan's training settings were refused by transformers: {e}",
            fix=refusal_fix(plan, "transformers", transformers.__version__, e),
        ) from e


def refusal_fix(plan: Plan, package: str, installed: str, error: BaseException) -> str:
    """The next step after a library refused what the plan asks: a missing package, a version the plan
    was not made for, or a setting to change in the spec."""
    if isinstance(error, ImportError):
        name = getattr(error, "name", None)
        return f"install {name}" if name else "install the package the message names"
    planned = (plan.fingerprint.get("versions") or {}).get(package)
    if planned and planned != installed:
        return (
            f"the plan was made for {package} {planned} and {installed} is installed: "
            "re-run `gpuplan plan` here, or install the version the plan was made for"
        )
    return "change the setting the message names in the spec, then re-run `gpuplan plan`"
