"""Hand-built Plans for the apply tests (the executor reads only a Plan).

`cpu_plan(tmp_path, **overrides)` returns a Plan for hardware "cpu" training a tiny
Llama from scratch on the shipped corpus; override any key path with
`cpu_plan(tmp_path, **{"training.optim": "adafactor"})`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuplan.plan.sections import HardwareSection, MemorySection, ModelSection, ThroughputSection
from gpuplan.plan.types import Plan, Setting

REPO = Path(__file__).resolve().parents[2]
CORPUS = str(REPO / "specs" / "data" / "tiny-corpus.txt")
SENTIMENT_CSV = str(REPO / "specs" / "data" / "sentiment.csv")
SENTIMENT_JSONL = str(REPO / "specs" / "data" / "sentiment.jsonl")

CPU_PROFILE = {
    "name": "cpu",
    "vendor": "cpu",
    "memory_bytes": 16 * 2**30,
    "compute_capability": None,
    "bf16": False,
    "tf32": False,
    "fp8": False,
    "peak_tflops": {"fp32": 0.5},
    "memory_bandwidth_gbps": 20.0,
    "interconnect": {},
    "aliases": [],
}
H100_PROFILE = dict(
    CPU_PROFILE, name="H100-80GB", vendor="nvidia", memory_bytes=80 * 2**30, compute_capability=[9, 0], bf16=True, tf32=True, fp8=True
)

# A Llama small enough that a training step takes milliseconds on one CPU core.
MICRO_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 260,
    "max_position_embeddings": 256,
    "pad_token_id": 256,
    "bos_token_id": 257,
    "eos_token_id": 258,
    "tie_word_embeddings": True,
}
MICRO_BERT = {
    "model_type": "bert",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 261,
    "max_position_embeddings": 256,
    "pad_token_id": 256,
}


def write_config(tmp_path: Path, config: dict[str, Any], name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def defaults(tmp_path: Path) -> dict[str, Any]:
    return {
        "model.config": write_config(tmp_path, MICRO_LLAMA),
        "model.name_or_path": None,
        "model.from_scratch": True,
        "model.task": "causal-lm",
        "model.num_labels": 2,
        "model.dtype": "float32",
        "model.attn_implementation": "sdpa",
        "model.trust_remote_code": False,
        "model.allow_pickle_weights": False,
        "hardware.count": 1,
        "hardware.nodes": 1,
        "data.train_files": [CORPUS],
        "data.eval_files": [],
        "data.eval_fraction": 0.0,
        "data.text_field": "text",
        "data.label_field": None,
        "data.seq_len": 64,
        "data.packing": True,
        "training.effective_batch_size": 8,
        "training.per_device_train_batch_size": 8,
        "training.per_device_eval_batch_size": 8,
        "training.gradient_accumulation_steps": 1,
        "training.gradient_checkpointing": False,
        "training.bf16": False,
        "training.fp16": False,
        "training.tf32": False,
        "training.optim": "adamw_torch",
        "training.learning_rate": 3e-3,
        "training.max_steps": 4,
        "training.num_train_epochs": 1.0,
        "training.lr_scheduler_type": "linear",
        "training.warmup_steps": 0,
        "training.weight_decay": 0.0,
        "training.max_grad_norm": 1.0,
        "training.logging_steps": 1,
        "training.save_steps": 1000,
        "training.save_total_limit": 1,
        "training.eval_steps": None,
        "training.seed": 0,
        "training.dataloader_pin_memory": False,
        "training.dataloader_num_workers": 0,
        "training.torch_compile": False,
        "training.torch_compile_backend": "inductor",
        "training.torch_empty_cache_steps": 0,
        "training.loss_chunk_size": 0,
        "training.use_liger_kernel": False,
        "training.activation_offloading": False,
        "output.dir": str(tmp_path / "run"),
        # keys the planner adds beyond the first contract; read with plan.get() and a default
        "training.warmup_ratio": None,
        "training.torch_compile_mode": None,
        "distributed.strategy": "none",
        "distributed.fsdp_sharding": "full_shard",
        "distributed.fsdp_cpu_offload": False,
        "distributed.zero_stage": "auto",
        "distributed.offload_optimizer": False,
        "distributed.offload_params": False,
        "data.format": "text",
        "data.messages_field": "messages",
        "data.chat_template": None,
        "data.prompt_field": "prompt",
        "data.response_field": "response",
        "data.prompt_template": "### Instruction:\n{prompt}\n\n### Response:\n",
        "data.train_on_prompt": False,
        "data.dataset": None,
        "data.revision": "main",
        "data.split": "train",
        "training.report_to": "none",
        "model.revision": "main",
        "model.commit": None,  # derived for Hub ids only (plan/inputs/sources.py)
        "data.commit": None,
        # parameter-efficient fine-tuning (issue 12); "full" ignores the rest
        "model.method": "full",
        "lora.r": 8,
        "lora.lora_alpha": 16,
        "lora.lora_dropout": 0.0,
        "lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "lora.use_dora": False,
        "lora.modules_to_save": None,
        "quantization.bnb_4bit_quant_type": "nf4",
        "quantization.bnb_4bit_use_double_quant": True,
        "quantization.bnb_4bit_compute_dtype": "float32",
        "output.merge_adapter": False,
        # the rest of a complete plan (Plan refuses one without them: plan/resolved.py), as an sft plan has them
        "hardware.gpu": "cpu",
        "hardware.memory_gib": None,
        "hardware.headroom": 0.08,
        "hardware.host_memory_gib": None,
        "hardware.cpu_count": None,
        "hardware.price_per_hour": None,
        "hardware.interconnect": "auto",
        "hardware.network": "auto",
        "training.run_name": None,
        "training.objective": "sft",
        "preference.beta": None,
        "preference.loss_type": "auto",
        "preference.max_length": None,
        "preference.max_prompt_length": None,
        "preference.reference": "auto",
        "preference.reference_model": None,
        # [rl] as an sft plan has it (grpo / rloo only: plan/resolved.py RlSettings)
        "rl.num_generations": "auto",
        "rl.max_prompt_length": None,
        "rl.max_completion_length": 512,
        "rl.temperature": 1.0,
        "rl.top_p": 1.0,
        "rl.beta": None,
        "rl.loss_type": "auto",
        "rl.generation_batch_size": "auto",
        "rl.generation_backend": "transformers",
        "rl.vllm_gpu_memory_utilization": "auto",
        "rl.vllm_tensor_parallel_size": 1,
        "rl.vllm_enable_sleep_mode": False,
        "rl.vllm_server_gpus": None,
        "rl.rewards": [],
        "rl.reference": "auto",
        "distributed.master_addr": None,
        "distributed.master_port": 29500,
        "eval.tasks": [],
        "eval.include_path": None,
        "eval.num_fewshot": None,
        "eval.limit": None,
        "eval.sample_prompts": [],
        "eval.sample_max_new_tokens": 32,
        "eval.sample_at_eval": False,
        # a vision-language model's (plan/resolved.py VisionSettings); a text plan's defaults
        "vision.image_size": None,
        "vision.images_per_example": 0,
        "vision.train_tower": False,
        "vision.processor_config": None,
        "vision.family": None,
        "vision.image_tokens": 0,
        "vision.image_token_id": None,
        "vision.tower_modules": (),
        "vision.projector_modules": (),
        "vision.language_model_modules": (),
        "vision.frozen_modules": (),
        "vision.lora_exclude": None,
    }


def cpu_plan(
    tmp_path: Path, hardware: dict[str, Any] | None = None, memory: dict | None = None, throughput: dict | None = None, **overrides: Any
) -> Plan:
    values = defaults(tmp_path)
    unknown = set(overrides) - set(values)
    assert not unknown, f"not a contract key: {unknown}"
    values.update(overrides)
    return Plan(
        spec_path=None,
        spec_sha256=None,
        hardware=HardwareSection.from_dict(hardware or CPU_PROFILE),
        model=ModelSection(model_type="llama", task="causal-lm"),
        settings={k: Setting(v, "user") for k, v in values.items()},
        memory=MemorySection.from_dict(memory or {"allocated_peak_bytes": 50 * 2**20}),
        throughput=ThroughputSection.from_dict(throughput or {"tokens_per_second": 20000.0}),
    )


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
