"""`gpuplan export`: the trained model as one standalone safetensors model directory.

- full: the model of final/ (or checkpoint-N/) as it is.
- lora: the adapter merged into the base (peft merge_and_unload), the base loaded at
  model.dtype; final/merged/ when apply already merged it.
- qlora: the adapter merged into a 16-bit copy of the base, loaded from the base's own
  files (quantization.bnb_4bit_compute_dtype when 16-bit, else bfloat16), never into the
  4-bit weights it trained on: merging into 4-bit would round the update away. The
  merged model differs from adapter-on-4-bit by the base's quantization error, as every
  QLoRA merge does.
The directory gets the weights (safetensors), config.json, generation_config.json, the
tokenizer with the training's chat template (data.format = "chat"; for "instruction"
a template built from data.prompt_template), and gpuplan-export.json saying what it
came from. It is written into a temporary directory beside DIR and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from typing import Any

from gpuplan.after.finished_run import FinishedRun
from gpuplan.errors import UserError

DTYPES = ("bfloat16", "float16", "float32")
EXPORT_FILE = "gpuplan-export.json"


def check_destination(dest: str) -> str:
    """DIR must be new (or an empty folder) inside a folder that exists; nothing is overwritten."""
    dest = os.path.abspath(dest)
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise UserError(f"--to {dest} already exists and is not an empty folder", fix="give a new folder: export never overwrites files")
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise UserError(f"--to {dest}: the folder {parent} does not exist", fix=f"create it first: mkdir -p {parent}")
    if not os.access(parent, os.W_OK):
        raise UserError(f"--to {dest}: cannot write in {parent}", fix="choose a writable folder")
    return dest


def export_dtype(run: FinishedRun, asked: str | None) -> str:
    if asked is not None:
        if asked not in DTYPES:
            raise UserError(f"--dtype {asked!r} is not one of {', '.join(DTYPES)}")
        return asked  # float32 for qlora is a wider copy than 16-bit: fine too, never the 4-bit one
    if run.trained.quantized_base:
        compute = run.plan.resolved.quantization.bnb_4bit_compute_dtype
        return compute if compute in ("bfloat16", "float16") else "bfloat16"
    return str(run.plan.resolved.model.dtype)


def instruction_chat_template(prompt_template: str) -> str:
    """A chat template that renders user/assistant turns as instruction training did (eos after answers)."""
    before, after = prompt_template.split("{prompt}", 1)
    return (
        "{% for m in messages %}{% if m['role'] == 'user' %}" + "{{ " + json.dumps(before) + " }}"
        "{{ m['content'] }}" + "{{ " + json.dumps(after) + " }}"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    )


def merged_model(run: FinishedRun, dtype: str) -> tuple[Any, str]:
    """(the standalone model, what it was made from)."""
    import torch

    from gpuplan.apply.model.load import auto_class
    from gpuplan.hub.fetch import model_dir

    plan = run.plan
    from gpuplan.apply.model.vision import is_vision_language

    cls = auto_class(plan.resolved.model.task, is_vision_language(plan))
    common = {
        "dtype": getattr(torch, dtype),
        "local_files_only": True,
        "use_safetensors": True,
        "trust_remote_code": plan.resolved.model.trust_remote_code,
    }
    if not run.trained.frozen_base or run.merged_dir is not None:
        src = run.merged_dir or run.weights_dir
        return cls.from_pretrained(src, **common), src
    from peft import PeftModel

    base_dir = model_dir(plan.resolved.model.hub)
    base = cls.from_pretrained(base_dir, **common)  # no quantization_config: the 16-bit (or wider) base
    with warnings.catch_warnings():  # peft 0.21 calls transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        model = PeftModel.from_pretrained(base, run.weights_dir).merge_and_unload()
    return model, f"adapter {run.weights_dir} merged into {base_dir} ({dtype})"


def export(run: FinishedRun, dest: str, dtype: str) -> dict[str, Any]:
    """Write the standalone model into `dest` (checked by check_destination); returns what was written."""
    from gpuplan.after.load import load_processor_of, load_tokenizer_of
    from gpuplan.apply.model.vision import is_vision_language
    from gpuplan.apply.quiet import disable_progress_bars

    disable_progress_bars()  # no "Loading weights" / "Writing model shards" bars around the summary
    processor = load_processor_of(run) if is_vision_language(run.plan) else None  # saved whole: image processor too
    tokenizer = processor.tokenizer if processor is not None else load_tokenizer_of(run)
    fmt = run.plan.resolved.data.format
    if fmt == "chat":
        from gpuplan.apply.data.chat import chat_template_of

        tokenizer.chat_template = chat_template_of(run.plan, tokenizer)
    elif fmt == "instruction":
        tokenizer.chat_template = instruction_chat_template(run.plan.resolved.data.prompt_template)
    model, source = merged_model(run, dtype)
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = True  # serving wants the KV cache (packed training turned it off)
    parent = os.path.dirname(dest)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.", dir=parent)
    try:
        model.save_pretrained(tmp)  # safetensors (transformers 5 writes no pickle)
        if processor is not None:
            processor.chat_template = tokenizer.chat_template
            processor.save_pretrained(tmp)  # the image processor's config, the tokenizer, the chat template
        else:
            tokenizer.save_pretrained(tmp)
        info = {
            "source": source,
            "spec": os.path.abspath(run.spec_path),
            "output_dir": run.output_dir,
            "method": run.trained.name,
            "dtype": dtype,
            "checkpoint": run.checkpoint,
            "format": fmt,
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        }
        with open(os.path.join(tmp, EXPORT_FILE), "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)
        if os.path.isdir(dest):
            os.rmdir(dest)  # empty (check_destination)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**info, "dir": dest, "files": sorted(os.listdir(dest))}


def serve_commands(dest: str, dtype: str, context: int) -> list[str]:
    return [
        f"vllm serve {dest} --dtype {dtype} --max-model-len {context}",
        f"docker run --gpus all --shm-size 1g -p 8080:80 -v {dest}:/model "
        f"ghcr.io/huggingface/text-generation-inference:latest --model-id /model --max-total-tokens {context}",
        f"python -c \"from transformers import pipeline; print(pipeline('text-generation', model='{dest}')"
        f"('Hello', max_new_tokens=32)[0]['generated_text'])\"",
    ]


def memory_for(dest: str, task: str, dtype: str, context: int, batch: int = 1) -> Any:
    from gpuplan.modelinfo import model_facts, read_config
    from gpuplan.plan.estimate.memory.inference import inference_memory

    return inference_memory(model_facts(read_config(dest), task), dtype=dtype, context=context, batch=batch)
