"""The trained model and its tokenizer, loaded the way the run trained them.

- model.method = "full": the model in final/ (or checkpoint-N/).
- "lora" with output.merge_adapter: final/merged/, a plain transformers model.
- "lora" / "qlora" otherwise: the base at the commit the state recorded (model.commit),
  loaded as apply loaded it (model.dtype; qlora: the same 4-bit BitsAndBytesConfig,
  apply/model/adapters.py load_kwargs), with peft's PeftModel.from_pretrained on top.
The device is CUDA when there is one, else the CPU; under training.bf16 / fp16 the
forward runs in autocast, as the Trainer ran it (`autocast`). flash_attention_2 is a
CUDA kernel: on the CPU the model loads with sdpa instead, and says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpuplan.after.finished_run import FinishedRun
from gpuplan.apply.model.generation import Loaded


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer_of(run: FinishedRun) -> Any:
    """The tokenizer saved beside the weights (the Trainer saves it), else the one training built."""
    from gpuplan.apply.data.tokenizer import has_tokenizer_files, load_tokenizer
    from gpuplan.lifecycle.run_dir import FINAL_DIR

    plan = run.plan
    trust = plan.resolved.model.trust_remote_code
    task = plan.resolved.model.task
    for d in (run.weights_dir, os.path.join(run.output_dir, FINAL_DIR)):
        if has_tokenizer_files(d):
            return load_tokenizer(d, task=task, from_scratch=False, trust_remote_code=trust)
    from gpuplan.hub.fetch import model_dir

    return load_tokenizer(
        model_dir(plan.resolved.model.hub), task=task, from_scratch=plan.resolved.model.from_scratch, trust_remote_code=trust
    )


def load_processor_of(run: FinishedRun) -> Any:
    """A vision-language run's processor: saved beside the weights (the Trainer saves it), else the base's."""
    from gpuplan.apply.data.vision import load_processor
    from gpuplan.hub.fetch import model_dir
    from gpuplan.lifecycle.run_dir import FINAL_DIR

    trust = run.plan.resolved.model.trust_remote_code
    for d in (run.weights_dir, os.path.join(run.output_dir, FINAL_DIR)):
        if os.path.isfile(os.path.join(d, "processor_config.json")) or os.path.isfile(os.path.join(d, "preprocessor_config.json")):
            return load_processor(d, trust)
    return load_processor(model_dir(run.plan.resolved.model.hub), trust)


def load_trained(run: FinishedRun, *, echo: Callable[[str], None] = lambda s: None, device: str | None = None) -> Loaded:
    import torch

    from gpuplan.apply.errors import ApplyError
    from gpuplan.apply.model.adapters import keep_training_layout
    from gpuplan.apply.model.load import auto_class
    from gpuplan.apply.model.quant4 import load_kwargs
    from gpuplan.apply.quiet import disable_progress_bars
    from gpuplan.apply.train.arguments import torch_dtype
    from gpuplan.hub.fetch import model_dir

    disable_progress_bars()  # no "Loading weights" / tokenize bars around the answers
    plan = run.plan
    device = device or pick_device()
    from gpuplan.apply.model.vision import is_vision_language

    vision = is_vision_language(plan)
    processor = load_processor_of(run) if vision else None
    tokenizer = processor.tokenizer if processor is not None else load_tokenizer_of(run)
    cls = auto_class(plan.resolved.model.task, vision)
    attn = plan.resolved.model.attn_implementation
    if attn == "flash_attention_2" and device != "cuda":
        echo("the run used flash_attention_2, a CUDA kernel; on the CPU the model runs with sdpa")
        attn = "sdpa"
    common: dict[str, Any] = {
        "dtype": torch_dtype(plan),
        "attn_implementation": attn,
        "local_files_only": True,
        "trust_remote_code": plan.resolved.model.trust_remote_code,
    }
    try:
        if not run.trained.frozen_base or run.merged_dir is not None:
            where = run.merged_dir or run.weights_dir
            model = cls.from_pretrained(where, use_safetensors=True, **common)
            what = f"{'merged model' if run.merged_dir else 'model'} {where}"
        else:
            from peft import PeftModel

            base_dir = model_dir(plan.resolved.model.hub)
            # qlora: load_kwargs' dtype (the compute dtype the base trained in) replaces the plan's weight dtype
            base = cls.from_pretrained(base_dir, **{**common, **load_kwargs(plan, device, cls)})
            if run.trained.quantized_base:
                keep_training_layout(base)  # the 4-bit layout the adapter trained (and apply evaluated) on
            model = PeftModel.from_pretrained(base, run.weights_dir, is_trainable=False)
            what = f"adapter {run.weights_dir} on the base {base_dir}" + (" (4-bit, as trained)" if run.trained.quantized_base else "")
    except (OSError, ValueError) as e:
        raise ApplyError(
            f"cannot load the trained model from {run.weights_dir}: {e}",
            fix="check that the run's files are complete; train again with --restart",
        ) from e
    if not run.trained.quantized_base:  # a 4-bit model is placed while loading (device_map on CUDA)
        model = model.to(device)
    model.eval()
    if getattr(model.config, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    amp = None
    if device == "cuda" and plan.resolved.training.bf16:
        amp = torch.bfloat16
    elif device == "cuda" and plan.resolved.training.fp16:
        amp = torch.float16
    if run.checkpoint is not None:
        what += f" (checkpoint at step {run.checkpoint})"
    return Loaded(model, tokenizer, device, what, amp, processor)
