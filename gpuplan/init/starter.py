"""`gpuplan init`: a commented starter spec for one model config and one GPU.

The keys, their order, defaults and comments come from the schema (Spec, SECTIONS,
model_fields, descriptions), so the starter follows the schema when it changes; the
tables below only add what the schema does not say (a comment for an undescribed key,
an example for a key without a default). Values that change the training itself
(seq_len, effective batch, dtype) are starting points the comments explain.
"""

from __future__ import annotations

import textwrap
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.hardware.catalog import AmbiguousGPUError, UnknownGPUError, lookup
from gpuplan.hardware.profile import GPUProfile
from gpuplan.init.model_source import ModelSource, model_source
from gpuplan.modelinfo import ModelConfigError, model_facts
from gpuplan.spec.schema import SECTIONS
from gpuplan.toml_value import toml_value
from gpuplan.units import GIB

NOTE_WIDTH = 100  # a note above a key wraps at this width, in comment lines
SEQ_LEN_CAP = 2048  # longer contexts are a deliberate choice, not a starting point
TOKENS_PER_STEP = 2**17  # ~131k tokens per optimizer step: a common fine-tuning scale
SEQ_CLS_BATCH = 32  # Devlin et al. 2019 (BERT), appendix A.3: fine-tuning batch 16 or 32
# fp32 weights 4 + fp32 grads 4 + AdamW exp_avg and exp_avg_sq 8 bytes per parameter
# (docs/design.md "Memory model"; ZeRO paper, Rajbhandari et al. 2020, section 3.1).
FP32_ADAMW_BYTES_PER_PARAM = 16

SECTION_COMMENTS = {
    "model": "What to train: the architecture, where weights come from, the task.",
    "lora": 'LoRA adapters (peft LoraConfig names), read when model.method is "lora", "qlora" or "auto".',
    "quantization": 'The 4-bit frozen base of model.method = "qlora" (bitsandbytes BitsAndBytesConfig names).',
    "hardware": "Where it runs. gpuplan plans for this GPU; it need not be the machine you plan on.",
    "data": "What it reads.",
    "training": 'How it trains, in TrainingArguments names. "auto": gpuplan decides, and the plan says why.',
    "preference": 'Preference tuning (TRL DPOConfig / KTOConfig names), read when training.objective is "dpo" or "kto".',
    "rl": 'Online RL (TRL GRPOConfig / RLOOConfig names), read when training.objective is "grpo" or "rloo" (docs/grpo.md).',
    "distributed": "More than one GPU or node.",
    "output": "Where the run writes checkpoints and its state.",
    "eval": "After training: gpuplan eval's lm-eval tasks, and prompts to generate at the end of apply.",
    "launch": "Where apply runs it: here, or handed off to a Slurm, Kubernetes, SkyPilot or Ray cluster (docs/clusters.md).",
    "vision": "A vision-language model's images (docs/vision.md); read only for one.",
}

# Comments for fields the schema leaves undescribed (none at present; a description wins).
KEY_COMMENTS: dict[str, str] = {}

# Keys written active; every other key is written commented out.
ACTIVE = {
    "model": ("config", "task", "dtype", "attn_implementation", "trust_remote_code"),
    "lora": (),
    "quantization": (),
    "hardware": ("gpu", "count", "nodes"),
    "data": ("train_files", "text_field", "seq_len", "packing"),
    "training": (
        "effective_batch_size",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "gradient_checkpointing",
        "bf16",
        "fp16",
        "tf32",
        "optim",
        "learning_rate",
        "max_steps",
        "lr_scheduler_type",
        "logging_steps",
        "save_steps",
        "seed",
        "dataloader_pin_memory",
        "dataloader_num_workers",
        "torch_compile",
    ),
    "preference": (),
    "rl": (),
    "distributed": ("strategy",),
    "output": ("dir",),
    "eval": (),
    "launch": (),
    "vision": (),
}

# Shown (commented out) for keys whose default is None or whose default says little.
EXAMPLES: dict[str, Any] = {
    "model.config": "models/my-model.json",
    "model.name_or_path": "/models/my-model",
    "model.from_scratch": True,
    "model.num_labels": 2,
    "model.method": "lora",
    "lora.lora_alpha": 32,
    "lora.target_modules": "all-linear",
    "lora.modules_to_save": ["lm_head"],
    "hardware.memory_gib": 80,
    "hardware.host_memory_gib": 256,
    "hardware.price_per_hour": 2.79,
    "hardware.cpu_count": 32,
    "data.eval_files": ["data/eval.jsonl"],
    "data.eval_fraction": 0.05,
    "data.label_field": "label",
    "data.dataset": "HuggingFaceH4/ultrachat_200k",
    "data.chat_template": "chatml",
    "training.max_steps": 1000,
    "training.warmup_ratio": 0.03,
    "training.save_total_limit": 2,
    "training.eval_steps": 500,
    "training.torch_compile_backend": "inductor",
    "training.torch_compile_mode": "default",
    "training.run_name": "my-run",
    "distributed.master_addr": "10.0.0.1",
    "preference.beta": 0.1,
    "preference.max_length": 2048,
    "preference.max_prompt_length": 1024,
    "preference.reference_model": "/models/my-reference",
    "rl.max_prompt_length": 512,
    "rl.beta": 0.04,
    "rl.vllm_server_gpus": 1,
    "eval.tasks": ["hellaswag"],
    "eval.include_path": "eval-tasks",
    "eval.num_fewshot": 0,
    "eval.limit": 100,
    "eval.sample_prompts": ["Write a haiku about GPUs."],
    "launch.storage": "/shared",
    "launch.time_limit_minutes": 120,
    "launch.job_name": "my-run",
    "launch.partition": "gpu",
    "launch.account": "my-account",
    "launch.qos": "normal",
    "launch.image": "ghcr.io/my-org/trainer:1.0",
    "launch.namespace": "ml",
    "launch.queue": "team-a",
    "launch.storage_claim": "shared-pvc",
    "launch.storage_bucket": "s3://my-bucket",
    "launch.ray_address": "auto",
    "launch.ray_dashboard_address": "http://ray-head:8265",
    "vision.image_size": 1024,
    "vision.processor_config": "models/my-vlm/processor_config.json",
}


def starter_spec(
    model: Path | ModelSource,
    gpu: str,
    *,
    task: str = "causal-lm",
    spec_dir: Path,
    choices: Mapping[str, tuple[Any, str | None]] | None = None,
) -> str:
    """A commented spec (format 1) for `model` (config.json, model directory, or a resolved
    ModelSource: init/model_source.py) on `gpu`.

    `gpu` is a catalog name (forgiving: "a100 80gb"), "auto" or "cpu". A model path is
    written relative to `spec_dir`, where the spec will live. `choices` ({key: (value, note)})
    are values chosen outside the schema's defaults (init's --data and the planner's method),
    each written active with its note as the comment above it. Raises GpuplanError for an
    unknown GPU, an unreadable model config or a task the model cannot do.
    """
    source = model if isinstance(model, ModelSource) else model_source(Path(model))
    tasks = typing.get_args(SECTIONS["model"].model_fields["task"].annotation)
    if task not in tasks:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "model.task",
                    f"task {task!r}: not a task gpuplan knows; allowed: {', '.join(tasks)}",
                    fix=f"use --task {tasks[0]}",
                )
            ]
        )
    profile = _gpu(gpu)
    facts = _facts(source.config, task)
    values, notes = _values(source, profile, gpu, task, source.config, facts, Path(spec_dir))
    for key, (value, note) in (choices or {}).items():
        if value is None:  # written commented out, as a key the spec leaves at its default
            values.pop(key, None)
            continue
        values[key] = value
        if note:
            notes[key] = note
    if "data.dataset" in (choices or {}):
        values.pop("data.train_files", None)  # one source of data: plan refuses both
    where = profile.name if profile is not None else gpu
    lines = [
        f"# gpuplan spec (format 1) for {source.name} on {where}, written by `gpuplan init`.",
        '# "auto" asks gpuplan to decide; `gpuplan plan <this file>` shows every decision and the memory.',
        "# Commented-out keys are rarely needed; each shows its default or an example.",
    ]
    for section, schema in SECTIONS.items():
        lines += ["", f"# {SECTION_COMMENTS.get(section, section)}", f"[{section}]"]
        rows = []  # (note line above or None, key line, comment)
        for key, info in schema.model_fields.items():
            full = f"{section}.{key}"
            active = full in values
            value = values[full] if active else _example(full, info)
            text = f"{key} = {toml_value(value)}" if active else f"# {key} = {toml_value(value)}"
            rows.append((notes.get(full), text, _comment(full, info)))
        width = min(max(len(t) for _, t, _ in rows) + 2, 44)
        for note, text, comment in rows:
            if note:
                lines += [f"# {part}" for part in textwrap.wrap(note, NOTE_WIDTH, break_on_hyphens=False)]
            lines.append(f"{text:<{width}}# {comment}" if len(text) < width else f"{text}  # {comment}")
    return "\n".join(lines) + "\n"


def _gpu(gpu: str) -> GPUProfile | None:
    if gpu == "auto":
        return None
    try:
        return lookup(gpu)
    except (UnknownGPUError, AmbiguousGPUError) as e:
        raise GpuplanError(
            [Diagnostic("error", "hardware.gpu", f"--gpu {gpu!r}: {e}", fix="run `gpuplan gpus` for the catalog, or use --gpu auto")]
        ) from None


def _facts(config: dict[str, Any], task: str):
    """Facts for an architecture gpuplan counts without torch; None for others (plan still works)."""
    try:
        return model_facts(config, task, allow_meta_fallback=False)
    except ModelConfigError as e:
        if "no analytic parameter count" in str(e):
            return None
        raise GpuplanError([Diagnostic("error", "model.task", f"model.task = {task!r}: {e}")]) from None


def _values(
    source: ModelSource, profile: GPUProfile | None, gpu: str, task: str, config: dict[str, Any], facts, spec_dir: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """The active keys' values, and a note for each value the starter chose for this model."""
    values: dict[str, Any] = {}
    for section, keys in ACTIVE.items():
        for key in keys:
            values[f"{section}.{key}"] = _default(SECTIONS[section].model_fields[key])
    notes: dict[str, str] = {}
    if source.key == "model.name_or_path":  # a model directory or a Hub id: fine-tune its weights
        del values["model.config"]
    values[source.key] = source.value(spec_dir)
    values["model.task"] = task
    values["hardware.gpu"] = profile.name if profile is not None else gpu
    if task == "seq-cls":
        values["model.num_labels"] = 2
        values["data.label_field"] = "label"
    maxpos = facts.max_position_embeddings if facts is not None else _config_positions(config)
    seq_len = values["data.seq_len"]
    if maxpos:
        # A power of two: roberta's 514 positions hold 512 tokens (two are padding offsets).
        seq_len = 2 ** (min(maxpos, SEQ_LEN_CAP).bit_length() - 1)
        notes["data.seq_len"] = (
            f"Starter value: the model has {maxpos} positions; the largest power of two up to that, at most {SEQ_LEN_CAP}."
        )
    values["data.seq_len"] = seq_len
    if task == "seq-cls":
        values["training.effective_batch_size"] = SEQ_CLS_BATCH
        notes["training.effective_batch_size"] = "Starter value: BERT's fine-tuning batch (16 or 32)."
    else:
        values["training.effective_batch_size"] = max(8, min(256, TOKENS_PER_STEP // seq_len))
        notes["training.effective_batch_size"] = f"Starter value: about {TOKENS_PER_STEP // 1024}k tokens per step at this seq_len."
    values["training.max_steps"] = 1000
    values["output.dir"] = f"runs/{source.name}"
    if facts is not None and profile is not None and profile.bf16:
        need = facts.n_params * FP32_ADAMW_BYTES_PER_PARAM
        usable = profile.memory_bytes * (1 - SECTIONS["hardware"].model_fields["headroom"].default)
        if need > usable:
            values["model.dtype"] = "bfloat16"
            notes["model.dtype"] = (
                f"Starter value: fp32 weights + grads + AdamW would need {need / GIB:.0f} GiB"
                f" of the {usable / GIB:.0f} GiB usable on {profile.name}."
            )
    return values, notes


def _config_positions(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _default(info: FieldInfo) -> Any:
    return info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]


def _example(full: str, info: FieldInfo) -> Any:
    if full in EXAMPLES:
        return EXAMPLES[full]
    return _default(info)


def _comment(full: str, info: FieldInfo) -> str:
    text = info.description or KEY_COMMENTS.get(full, "")
    options = _literal_options(info.annotation)
    shown = [str(o).lower() if isinstance(o, bool) else str(o) for o in options]
    if shown and len(shown) <= 6 and not all(o in text for o in shown):
        text = f"{text.rstrip('.')}. One of {' | '.join(shown)}."
    return text.strip()


def _literal_options(annotation: Any) -> list[Any]:
    """The values of a Literal (or Optional[Literal]) type; [] when other types are allowed too."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            inner = _literal_options(arg)
            if not inner:
                return []
            out += inner
        return out
    return []
