"""Build what apply builds from a plan, on a machine without a GPU (issue 11, guard 1).

`build_here(plan)` runs the same code apply runs (gpuplan.apply.train.arguments) and then the
objects transformers and accelerate make of it: TrainingArguments, the Trainer's
TorchDynamoPlugin (trainer.py _build_accelerator_args) and FullyShardedDataParallelPlugin
(trainer.py create_accelerator_and_postprocess). Only the checks that probe the device
this test runs on are taken out, and each is checked against the plan's GPU instead:
- bf16 and fp16 on a GPU plan: TrainingArguments asks torch whether *this* machine has a
  bf16 GPU, so the arguments are built with use_cpu = True; the plan's GPU must have bf16;
- tf32: TrainingArguments asks torch for an Ampere+ CUDA device; the plan's GPU must be
  an NVIDIA GPU with TF32 (transformers' is_torch_tf32_available needs torch.version.cuda);
- several CPU processes: ddp_backend = "gloo" makes TrainingArguments join torchrun's
  process group, which only a launched worker has; it is checked, not built;
- DeepSpeed: TrainingArguments imports deepspeed, not installed here; the ZeRO config is
  checked for the keys transformers' HfTrainerDeepSpeedConfig fills.
"""

from __future__ import annotations

import json
from typing import Any

from gpuplan.apply.train.arguments import training_arguments_kwargs
from gpuplan.plan.types import Plan


def saved(plan: Plan) -> Plan:
    """The plan as `plan --out` writes it and apply reads it."""
    return Plan.from_dict(json.loads(json.dumps(plan.to_dict())))


def build_with_scheduler(plan: Plan) -> dict[str, Any]:
    """build_here, plus the LR scheduler the Trainer creates from the arguments."""
    import torch
    from transformers import get_scheduler

    built = build_here(plan)
    args = built["args"]
    steps = args.max_steps if args.max_steps > 0 else 100
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    get_scheduler(
        args.lr_scheduler_type,
        opt,
        num_warmup_steps=args.get_warmup_steps(steps),
        num_training_steps=steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    return built


def build_here(plan: Plan) -> dict[str, Any]:
    """TrainingArguments and plugins from a plan; raises what transformers/accelerate raise."""
    from accelerate.utils import FullyShardedDataParallelPlugin, TorchDynamoPlugin
    from transformers import TrainingArguments

    kw = training_arguments_kwargs(plan, progress=False)
    hw = plan.hardware
    if hw.vendor != "cpu":
        if kw["bf16"]:
            assert hw.bf16, f"bf16 on {hw.name}, which has no bf16"
        if kw["tf32"]:
            assert hw.vendor == "nvidia" and hw.tf32, f"tf32 on {hw.name}: TrainingArguments raises there"
        kw = {**kw, "use_cpu": True, "tf32": False}
    if kw.get("ddp_backend") is not None:
        # several CPU processes: TrainingArguments joins the gloo group torchrun sets up
        # (accelerate PartialState); outside torchrun there is none, so it is checked, not built
        assert kw.pop("ddp_backend") == "gloo" and hw.vendor == "cpu"
    ds = kw.pop("deepspeed", None)
    if ds is not None:
        assert ds["zero_optimization"]["stage"] in (1, 2, 3)
        assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["gradient_accumulation_steps"] == "auto"
    args = TrainingArguments(**kw)
    out: dict[str, Any] = {"args": args, "kwargs": kw, "deepspeed": ds}
    if args.torch_compile:
        out["dynamo"] = TorchDynamoPlugin(backend=args.torch_compile_backend, mode=args.torch_compile_mode)
    if args.fsdp_plugin_args is not None:
        out["fsdp"] = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    return out
