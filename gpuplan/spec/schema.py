"""The spec (format 1) as Pydantic models: plain types, described fields, unknown keys refused.

Validators here only check; they never rewrite a value (resolution is the planner's
job, where every change gets a reason). "auto" asks gpuplan to decide.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, Field, model_validator

from gpuplan.spec.buckets import bucket_problem
from gpuplan.spec.names import COMPILE_BACKENDS, COMPILE_MODES, SCHEDULER_TYPES
from gpuplan.spec.trackers import TRACKER_NAMES
from gpuplan.spec.value_types import (
    Auto,
    BatchOrAuto,
    PathStr,
    StepsOrAuto,
    Task,
    WorkersOrAuto,
    _known_objective,
    _known_target,
    _Section,
    closed_set,
    launch_target_names,
    objective_names,
    optimizer_names,
    preference_loss_names,
    rl_loss_names,
)


class ModelSpec(_Section):
    config: PathStr | None = Field(None, description="Path to a config.json, relative to the spec file.")
    name_or_path: PathStr | None = Field(None, description="Local model directory (config.json + safetensors weights) to fine-tune.")
    from_scratch: bool = Field(False, description="Random init from the config instead of loading weights.")
    task: Task = Field("causal-lm", description="causal-lm, seq-cls or masked-lm.")
    num_labels: int | None = Field(None, ge=2, le=100_000, description="Number of classes (seq-cls).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights at load; float32 keeps fp32 master weights under AMP."
    )
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="Attention kernel; auto picks sdpa."
    )
    trust_remote_code: bool = Field(False, description="Run code shipped with the model; apply also needs --trust-remote-code.")
    allow_pickle_weights: bool = Field(False, description="Allow .bin/.pt weights (pickle can run code); safetensors otherwise.")
    revision: str = Field(
        "main", min_length=1, max_length=200, description="Hub ids: branch, tag or commit of name_or_path (the lock file pins it)."
    )
    method: Literal["full", "lora", "qlora", "auto"] = Field(
        "full",
        description="What is trained: full (every weight), lora (adapters on a frozen base), "
        "qlora (adapters on a 4-bit base); auto: full if it fits, else lora, else qlora.",
    )

    @model_validator(mode="after")
    def _has_a_source(self):
        if self.config is None and self.name_or_path is None:
            raise ValueError("set model.config (a config.json) or model.name_or_path (a model directory)")
        return self


class LoraSpec(_Section):
    """peft LoraConfig names (peft 0.21 tuners/lora/config.py); used by method lora and qlora."""

    r: int = Field(16, ge=1, le=65_536, description="LoRA rank (peft LoraConfig.r).")
    lora_alpha: int | None = Field(None, ge=1, le=1_048_576, description="LoRA scaling numerator; default 2 x r.")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: (
        Literal["all-linear"] | Annotated[list[Annotated[str, Field(min_length=1, max_length=200)]], Field(min_length=1, max_length=1000)]
    ) = Field("all-linear", description='"all-linear" (every linear layer but the output head) or a list of module names.')
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA): one magnitude vector per target.")
    modules_to_save: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=1000, description="Modules trained in full beside the adapters; seq-cls default: the head."
    )


class QuantizationSpec(_Section):
    """bitsandbytes BitsAndBytesConfig names for the 4-bit base of method qlora."""

    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type of the frozen base.")
    bnb_4bit_use_double_quant: bool = Field(True, description="Quantize the absmax constants too (~0.4 bit per weight saved).")
    bnb_4bit_compute_dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Dtype of the dequantized matmuls; auto: bfloat16 where the GPU has it, else float16."
    )


class HardwareSpec(_Section):
    gpu: str = Field("auto", min_length=1, max_length=200, description='Catalog name, "auto" or "cpu".')
    count: int = Field(1, ge=1, le=1024, description="GPUs per node.")
    nodes: int = Field(1, ge=1, le=4096, description="Number of nodes.")
    memory_gib: float | None = Field(None, gt=0, le=100_000, description="Override the catalog's memory.")
    headroom: float = Field(0.08, ge=0.0, le=0.5, description="Fraction of GPU memory the plan keeps free.")
    host_memory_gib: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="Host RAM per node (offload checks); default: this machine's when planning for it "
        "(gpu auto/cpu, one node), else unchecked.",
    )
    cpu_count: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="CPU cores per node (dataloader workers); default: this machine's when planning for it, else uncapped.",
    )
    interconnect: Literal["auto", "nvlink", "pcie"] = Field("auto", description="GPU-to-GPU link inside a node.")
    network: Literal["auto", "infiniband-ndr", "infiniband-hdr", "ethernet-100g"] = Field(
        "auto", description="Node-to-node fabric, one NIC per GPU; auto: InfiniBand NDR."
    )
    price_per_hour: float | None = Field(
        None, gt=0, le=10_000, description="USD per GPU-hour for the cost; default: your prices.toml, else the catalog's."
    )

    @property
    def world_size(self) -> int:
        """Processes the run has: GPUs per node x nodes (the one place outside the plan that multiplies them)."""
        return self.count * self.nodes


class DataSpec(_Section):
    train_files: list[PathStr] = Field(
        default_factory=list, max_length=10_000, description="Training data: .txt, .jsonl, .json, .csv or .parquet, relative to the spec."
    )
    eval_files: list[PathStr] = Field(default_factory=list, max_length=10_000, description="Evaluation data, same formats.")
    eval_fraction: float = Field(0.0, ge=0.0, le=0.5, description="Hold out this fraction of train for eval.")
    text_field: str = Field("text", min_length=1, max_length=200, description="Column holding the text.")
    label_field: str | None = Field(None, min_length=1, max_length=200, description="Label column (seq-cls).")
    seq_len: int = Field(512, ge=8, le=1_048_576, description="Tokens per sequence.")
    packing: bool | Auto = Field("auto", description="Pack documents into seq_len blocks (LM tasks).")
    dataset: str | None = Field(None, min_length=1, max_length=200, description="A Hub dataset id (org/name) instead of train_files.")
    revision: str = Field("main", min_length=1, max_length=200, description="Branch, tag or commit of data.dataset.")
    split: str = Field(
        "train",
        min_length=1,
        max_length=200,
        description="data.dataset: the split to train on, as the dataset card's configs name it (else by file names: train, test, ...).",
    )
    format: Literal["text", "chat", "instruction"] = Field(
        "text", description="text: plain documents; chat: rows of messages; instruction: prompt/response rows."
    )
    messages_field: str = Field(
        "messages", min_length=1, max_length=200, description="chat: column holding the list of {role, content} messages."
    )
    chat_template: PathStr | None = Field(
        None, description='chat: "chatml" or a Jinja file relative to the spec; default: the tokenizer\'s.'
    )
    prompt_field: str = Field("prompt", min_length=1, max_length=200, description="instruction: the prompt column.")
    response_field: str = Field("response", min_length=1, max_length=200, description="instruction: the response column.")
    prompt_template: str = Field(
        "### Instruction:\n{prompt}\n\n### Response:\n",
        min_length=1,
        max_length=10_000,
        description="instruction: text before the response; {prompt} is the prompt.",
    )
    train_on_prompt: bool = Field(False, description="chat/instruction: also train on prompt and user tokens.")

    @model_validator(mode="after")
    def _template_has_prompt(self):
        if "{prompt}" not in self.prompt_template:
            raise ValueError("data.prompt_template must contain {prompt} where the prompt goes")
        return self


class TrainingSpec(_Section):
    effective_batch_size: int | None = Field(None, ge=1, le=2**24, description="Sequences per optimizer step, all GPUs.")
    per_device_train_batch_size: BatchOrAuto = Field("auto", description="Sequences per GPU per forward; auto: largest that fits.")
    per_device_eval_batch_size: BatchOrAuto = Field("auto", description="Sequences per GPU in evaluation; auto: the train batch.")
    gradient_accumulation_steps: BatchOrAuto = Field(
        "auto", description="Micro-batches per optimizer step; auto: holds the effective batch."
    )
    gradient_checkpointing: bool | Auto = Field("auto", description="Recompute activations (~20% slower).")
    bf16: bool | Auto = Field("auto", description="bf16 mixed precision; auto: on Ampere and newer.")
    fp16: bool | Auto = Field("auto", description="fp16 mixed precision; auto: on GPUs without bf16.")
    tf32: bool | Auto = Field("auto", description="TF32 matmuls for fp32; auto: on Ampere and newer.")
    optim: str = Field(
        "auto",
        min_length=1,
        max_length=100,
        description="A transformers OptimizerNames value.",
        json_schema_extra=closed_set(optimizer_names),
    )
    learning_rate: float = Field(5e-5, gt=0, le=10, description="Peak learning rate.")
    max_steps: int | None = Field(None, ge=1, le=2**31, description="Optimizer steps; overrides num_train_epochs.")
    num_train_epochs: float = Field(3.0, gt=0, le=1e6, description="Passes over the data when max_steps is unset.")
    lr_scheduler_type: Literal[SCHEDULER_TYPES] = Field("linear", description="A transformers SchedulerType.")  # type: ignore[valid-type]
    warmup_steps: int = Field(0, ge=0, le=2**31, description="Linear warmup, in optimizer steps.")
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="Warmup as a fraction of max_steps.")
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0, le=1e6, description="Gradient clipping norm; 0 = off.")
    logging_steps: int = Field(10, ge=1, le=2**31, description="Log (and write metrics.jsonl) every N steps.")
    save_steps: int = Field(500, ge=1, le=2**31, description="Checkpoint every N steps.")
    save_total_limit: int | None = Field(None, ge=1, le=10_000, description="Keep at most N checkpoints.")
    eval_steps: int | None = Field(None, ge=1, le=2**31, description="Evaluate every N steps (needs eval data).")
    seed: int = Field(42, ge=0, le=2**32 - 1, description="Seed for init and data order.")
    dataloader_pin_memory: bool | Auto = Field("auto", description="Pinned host memory; auto: on with CUDA.")
    dataloader_num_workers: WorkersOrAuto = Field("auto", description="Data loading processes; auto: from the CPU count.")
    torch_compile: bool = Field(False, description="torch.compile the model.")
    torch_compile_backend: Literal[COMPILE_BACKENDS] | None = Field(None, description="torch._dynamo backend; default inductor.")  # type: ignore[valid-type]
    torch_compile_mode: Literal[COMPILE_MODES] | None = Field(None, description="torch.compile mode.")  # type: ignore[valid-type]
    torch_empty_cache_steps: StepsOrAuto = Field(0, description="Empty the CUDA cache every N steps; 0 = off.")
    loss_chunk_size: Annotated[int, Field(ge=0, le=2**20)] | Auto = Field(
        "auto",
        description="Output head + loss over chunks of N tokens, recomputed in backward; 0 = off; auto: only when the run needs it to fit.",
    )
    activation_offloading: bool = Field(
        False, description="Tensors saved for backward in pinned host RAM, copied back in backward (GPUs; not with gradient checkpointing)."
    )
    use_liger_kernel: bool = Field(
        False,
        description="Liger's Triton kernels (fused linear cross-entropy, RMSNorm, "
        "SwiGLU, RoPE); CUDA/ROCm GPUs, the families Liger patches.",
    )
    report_to: Literal[("none", "all") + TRACKER_NAMES] | list[Literal[TRACKER_NAMES]] = Field(  # type: ignore[valid-type]
        "none", description='Experiment trackers: "tensorboard", "mlflow", "wandb", ... or a list; logs go inside output.dir.'
    )
    run_name: str | None = Field(
        None, min_length=1, max_length=200, description="The run's name in the trackers; default: the spec's file name."
    )
    objective: Annotated[str, AfterValidator(_known_objective)] = Field(
        "sft",
        description="What the loss is: sft (next-token cross-entropy), dpo (chosen/rejected pairs), kto "
        "(labelled completions), or online RL on prompts scored by [[rl.rewards]]: grpo or rloo; with TRL's "
        "trainers; independent of model.method.",
        json_schema_extra=closed_set(objective_names),
    )


class PreferenceSpec(_Section):
    """TRL DPOConfig / KTOConfig names (trl 1.16) for training.objective = "dpo" or "kto"."""

    beta: float | None = Field(None, gt=0, le=100, description="Strength of the pull towards the reference; default: TRL's 0.1.")
    loss_type: str = Field(
        "auto",
        min_length=1,
        max_length=100,
        description="A TRL loss_type (dpo: sigmoid, ipo, hinge, ...; kto: kto, apo_zero_unpaired); auto: sigmoid for dpo, kto for kto.",
        json_schema_extra=closed_set(preference_loss_names),
    )
    max_length: int | None = Field(None, ge=8, le=1_048_576, description="Tokens of prompt + answer per sequence; default: data.seq_len.")
    max_prompt_length: int | None = Field(
        None, ge=1, le=1_048_576, description="Rows whose prompt has more tokens are reported unusable; default: max_length - 1."
    )
    reference: Literal["auto", "precomputed", "model"] = Field(
        "auto",
        description="The reference: auto (lora/qlora: the base with adapters disabled; full: a frozen copy "
        "in the compute dtype, or precomputed log-probs when that alone fits), precomputed "
        "(log-probs computed once before training), model (preference.reference_model).",
    )
    reference_model: PathStr | None = Field(
        None,
        description='A local model directory to use as the reference (reference = "model"; with reference = "auto" setting it chooses it).',
    )

    @model_validator(mode="after")
    def _model_has_a_path(self):
        if self.reference == "model" and self.reference_model is None:
            raise ValueError('preference.reference = "model" needs preference.reference_model (a model directory)')
        if self.reference == "precomputed" and self.reference_model is not None:
            raise ValueError(
                'preference.reference = "precomputed" computes the reference log-probs with the '
                "starting weights, not preference.reference_model; remove one of the two"
            )
        return self


REWARD_KINDS = ("exact-match", "regex", "length", "function")
# what each reward kind reads besides kind, weight and name, and what it must not be given
_REWARD_NEEDS = {"exact-match": ("column",), "regex": ("pattern",), "length": (), "function": ("function",)}
_REWARD_TAKES = {
    "exact-match": ("column", "pattern"),
    "regex": ("pattern",),
    "length": ("target_length",),
    "function": ("function",),
}
_WHAT = {
    "column": "the dataset column holding the reference answer",
    "pattern": "a Python regular expression",
    "function": '"file.py:function", a Python file beside the spec',
    "target_length": "completion tokens at which the penalty starts",
}


class RewardSpec(_Section):
    """One reward of [[rl.rewards]]: a built-in or a Python function, with its weight (GRPOConfig.reward_weights)."""

    kind: Literal["exact-match", "regex", "length", "function"] = Field(
        description="exact-match: 1 when the completion's answer equals the row's `column` (the first group of "
        "`pattern` if given, else the whole completion, stripped); regex: 1 when `pattern` matches the completion "
        "(re.search); length: -max(0, tokens - target_length) / target_length; function: a user function "
        "(`function`) with TRL's reward signature."
    )
    weight: float = Field(1.0, ge=-1000, le=1000, description="Weight of this reward in the sum (GRPOConfig.reward_weights).")
    name: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the reward in the metrics (rewards/<name>/mean); default: the kind, or the function's name.",
    )
    column: str | None = Field(None, min_length=1, max_length=200, description="exact-match: the dataset column with the reference answer.")
    pattern: str | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description="regex: the pattern the completion must match; exact-match: a pattern whose first group is the answer.",
    )
    target_length: int | None = Field(
        None, ge=1, le=1_048_576, description="length: completion tokens allowed before the penalty; default rl.max_completion_length / 2."
    )
    function: PathStr | None = Field(
        None, min_length=4, max_length=4096, description='function: "file.py:function", the file relative to the spec.'
    )

    @model_validator(mode="after")
    def _fields_of_kind(self):
        for key in _REWARD_NEEDS[self.kind]:
            if getattr(self, key) is None:
                raise ValueError(f'kind = "{self.kind}" needs {key} ({_WHAT[key]}); set it in this [[rl.rewards]] table')
        for key in ("column", "pattern", "target_length", "function"):
            if getattr(self, key) is not None and key not in _REWARD_TAKES[self.kind]:
                raise ValueError(f'kind = "{self.kind}" does not read {key}; remove it from this [[rl.rewards]] table')
        if self.pattern is not None:
            try:
                compiled = re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"pattern = {self.pattern!r} is not a Python regular expression ({e}); fix the pattern") from None
            if self.kind == "exact-match" and compiled.groups < 1:
                raise ValueError(
                    f"pattern = {self.pattern!r} has no group: exact-match compares the first group with the column; "
                    "put the answer in parentheses"
                )
        if self.function is not None:
            path, sep, name = self.function.rpartition(":")
            if not sep or not path.endswith(".py") or not name.isidentifier():
                raise ValueError(
                    f'function = {self.function!r} is not "file.py:function"; write the Python file, a colon and the function\'s name'
                )
        return self


class RlSpec(_Section):
    """TRL GRPOConfig / RLOOConfig names (trl 1.16) for training.objective = "grpo" or "rloo"."""

    num_generations: Annotated[int, Field(ge=2, le=4096)] | Auto = Field(
        "auto", description="Completions sampled per prompt (the group); auto: TRL's default, 8 for grpo, 2 for rloo."
    )
    max_prompt_length: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="Longest prompt in tokens the plan sizes for; longer rows are reported unusable; default: data.seq_len.",
    )
    max_completion_length: int = Field(512, ge=1, le=1_048_576, description="Tokens generated per completion at most (TRL's default 512).")
    temperature: float = Field(1.0, gt=0, le=100, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: the smallest token set with this much probability.")
    beta: float | None = Field(
        None, ge=0, le=100, description="KL coefficient towards the reference; 0 loads no reference; default: TRL's (grpo 0.0, rloo 0.05)."
    )
    loss_type: str = Field(
        "auto",
        min_length=1,
        max_length=100,
        description="grpo: a GRPOConfig loss_type (dapo, grpo, dr_grpo, bnpo, cispo, sapo); auto: TRL's dapo. rloo has none.",
        json_schema_extra=closed_set(rl_loss_names),
    )
    generation_batch_size: Annotated[int, Field(ge=2, le=2**24)] | Auto = Field(
        "auto",
        description="Completions generated per round, all GPUs; a multiple of num_generations and of the global "
        "micro-batch; auto: the effective batch (one round per optimizer step).",
    )
    generation_backend: Literal["transformers", "vllm-colocate", "vllm-server"] = Field(
        "transformers",
        description="Who generates: transformers (model.generate), vllm-colocate (vLLM inside each "
        "training process, on the training GPUs) or vllm-server (`trl vllm-serve` on GPUs of its own).",
    )
    vllm_gpu_memory_utilization: Annotated[float, Field(gt=0, lt=1)] | Auto = Field(
        "auto", description="vllm-colocate: the share of each GPU's memory vLLM takes (weights + KV cache); auto: the fit chooses it."
    )
    vllm_tensor_parallel_size: int = Field(
        1, ge=1, le=1024, description="vLLM tensor parallelism (colocate: over the training GPUs; server: its GPUs)."
    )
    vllm_enable_sleep_mode: bool = Field(
        False, description="vllm-colocate: vLLM frees its weights and KV cache while training runs, woken for each generation."
    )
    vllm_server_gpus: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="vllm-server: GPUs the server holds besides hardware.count (the training GPUs); default: vllm_tensor_parallel_size.",
    )
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        max_length=100,
        description="The rewards, each a [[rl.rewards]] table; their weighted sum scores a completion.",
    )


class DistributedSpec(_Section):
    strategy: Literal["auto", "none", "ddp", "fsdp", "deepspeed"] = Field(
        "auto", description="Data parallel engine for several GPUs; auto: the cheapest that fits."
    )
    fsdp_sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard"] = Field("full_shard", description="FSDP sharding strategy.")
    fsdp_cpu_offload: bool = Field(False, description="FSDP: parameters and gradients offloaded to host RAM.")
    zero_stage: Literal[1, 2, 3] | Auto = Field("auto", description="DeepSpeed ZeRO stage.")
    offload_optimizer: bool = Field(False, description="DeepSpeed: optimizer states in host RAM.")
    offload_params: bool = Field(False, description="DeepSpeed ZeRO-3: parameters in host RAM.")
    master_addr: str | None = Field(None, max_length=255, description="Rendezvous host for several nodes.")
    master_port: int = Field(29500, ge=1, le=65535, description="Rendezvous port.")


class OutputSpec(_Section):
    dir: Annotated[PathStr, Field(min_length=1, max_length=4096)] | None = Field(
        None, description="Run directory; default runs/<spec name>."
    )
    merge_adapter: bool = Field(False, description="lora: also save the model with the adapter merged into the base weights.")


class EvalSpec(_Section):
    """After training: held-out loss (always), lm-evaluation-harness tasks, sample generations."""

    tasks: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        default_factory=list,
        max_length=1000,
        description="lm-evaluation-harness task names for `gpuplan eval` (needs the `eval` extra: lm-eval).",
    )
    include_path: PathStr | None = Field(
        None, description="A folder of local lm-eval task YAML files, relative to the spec (offline tasks)."
    )
    num_fewshot: int | None = Field(None, ge=0, le=1000, description="lm-eval: few-shot examples per prompt.")
    limit: int | None = Field(None, ge=1, le=2**31, description="lm-eval: at most this many examples per task.")
    sample_prompts: list[Annotated[str, Field(min_length=1, max_length=10_000)]] = Field(
        default_factory=list,
        max_length=100,
        description="Prompts generated at the end of apply (written to metrics.jsonl), in the training's template.",
    )
    sample_max_new_tokens: int = Field(32, ge=1, le=4096, description="Tokens generated per sample prompt.")
    sample_at_eval: bool = Field(False, description="Also generate the sample prompts at every eval step.")


def _mountable_bucket(url: str) -> str:
    """launch.storage_bucket: a bucket SkyPilot mounts with MOUNT_CACHED (spec/buckets.py)."""
    if (problem := bucket_problem(url)) is not None:
        why, fix = problem
        raise ValueError(f"{url!r}: {why}; {fix}")
    return url


def _dashboard_url(url: str) -> str:
    """launch.ray_dashboard_address: the HTTP address of the Ray dashboard, where Ray's job client sends the job.

    Ray's client takes an address without a scheme for the cluster's GCS and looks the dashboard up there
    (ray/dashboard/utils.py get_address_for_submission_client), so "head:8265" would be taken for a GCS address."""
    parts = urlsplit(url)
    try:
        _ = parts.port  # urlsplit checks the port only when it is read (ValueError for "head:80a")
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and not any(c.isspace() for c in url)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f'{url!r} is not the Ray dashboard\'s http:// or https:// address; write it as "http://HEAD:8265" '
            "(the head node's dashboard, port 8265 unless `ray start --dashboard-port` says otherwise)"
        )
    return url


# The [launch] keys that belong to some targets only (gpuplan/clusters/ reads them); a key set for
# another target is refused, since it would do nothing there.
LAUNCH_TARGET_KEYS: dict[str, tuple[str, ...]] = {
    "partition": ("slurm",),
    "account": ("slurm",),
    "qos": ("slurm",),
    "image": ("kubernetes", "skypilot"),
    "namespace": ("kubernetes",),
    "queue": ("kubernetes",),
    "kubernetes_api": ("kubernetes",),
    "storage_claim": ("kubernetes",),
    "spot": ("skypilot",),
    "storage_bucket": ("skypilot",),
    "storage_shared": ("skypilot",),
    "ray_address": ("ray",),
    "ray_dashboard_address": ("ray",),
}
LAUNCH_REQUIRED: dict[str, tuple[str, ...]] = {"kubernetes": ("image",), "skypilot": ("image",)}

_Name = Annotated[str, Field(min_length=1, max_length=200)]


class LaunchSpec(_Section):
    """Where `gpuplan apply` runs the plan: here, or handed off to a cluster (gpuplan/clusters/, docs/clusters.md)."""

    target: Annotated[str, AfterValidator(_known_target)] = Field(
        "local",
        description="local: train on this machine; slurm, kubernetes, skypilot or ray: render the job, submit it with "
        "the engine's own client, and run `gpuplan apply` of the saved plan there.",
        json_schema_extra=closed_set(launch_target_names),
    )
    storage: Annotated[PathStr, Field(min_length=1, max_length=4096)] | None = Field(
        None,
        description="The shared file system, mounted at this path on every node: output.dir (checkpoints, state, "
        "run lock, the job's saved plan) must be under it. Required for several nodes.",
    )
    time_margin: float = Field(
        0.25, ge=0.0, le=10.0, description="The job's time limit: the high end of the planned run time x (1 + margin) + startup."
    )
    startup_minutes: int = Field(10, ge=0, le=24 * 60, description="Minutes added to the time limit for start-up and the final save.")
    time_limit_minutes: int | None = Field(
        None, ge=1, le=365 * 24 * 60, description="A fixed time limit instead of the planned one; refused when shorter than the run."
    )
    gpuplan_command: _Name = Field(
        "gpuplan", description='How a node starts gpuplan, split like a shell would ("/opt/venv/bin/gpuplan", "python -m gpuplan").'
    )
    job_name: Annotated[str, Field(min_length=1, max_length=50, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")] | None = Field(
        None, description="The job's name (lower-case letters, digits, -); default: training.run_name made DNS-safe."
    )
    partition: _Name | None = Field(None, description="slurm: the partition (sbatch --partition); default: the cluster's.")
    account: _Name | None = Field(None, description="slurm: the account charged (sbatch --account).")
    qos: _Name | None = Field(None, description="slurm: the quality of service (sbatch --qos).")
    image: Annotated[str, Field(min_length=1, max_length=1000)] | None = Field(
        None, description="kubernetes, skypilot: the container image the nodes run, with gpuplan and the training extras installed."
    )
    namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")] | None = Field(
        None, description="kubernetes: the namespace; default: default."
    )
    queue: _Name | None = Field(None, description="kubernetes: the Kueue LocalQueue (label kueue.x-k8s.io/queue-name).")
    kubernetes_api: Literal["trainjob", "job"] = Field(
        "trainjob",
        description="kubernetes: trainjob (a Kubeflow Trainer TrainJob on the torch-distributed runtime) or job "
        "(an Indexed Job and a headless Service, for clusters without Kubeflow).",
    )
    storage_claim: _Name | None = Field(None, description="kubernetes: the PersistentVolumeClaim mounted at launch.storage on every pod.")
    spot: bool = Field(False, description="skypilot: a managed job on spot instances, recovered after preemption and resumed by gpuplan.")
    storage_bucket: Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_mountable_bucket)] | None = Field(
        None,
        description='skypilot: the cloud bucket mounted at launch.storage on every node ("s3://my-bucket"; gs://, r2://, '
        "https:// Azure, oci://, nebius://, cw://, vastdata://), in SkyPilot's MOUNT_CACHED mode (gpuplan/spec/buckets.py).",
    )
    storage_shared: bool = Field(
        False,
        description="skypilot: launch.storage is already a shared file system on every node (the image or the cloud mounts it), "
        "so no bucket is mounted; several nodes need it or launch.storage_bucket.",
    )
    ray_address: _Name | None = Field(
        None,
        description='ray: the cluster the job\'s script joins (ray.init address); default: "auto". Without '
        "launch.ray_dashboard_address, `ray job submit` and `ray job status` find the dashboard through it too.",
    )
    ray_dashboard_address: Annotated[_Name, AfterValidator(_dashboard_url)] | None = Field(
        None,
        description='ray: the head\'s dashboard, where `ray job submit` and `ray job status` reach the cluster ("http://HEAD:8265"); '
        "default: found from launch.ray_address, else RAY_API_SERVER_ADDRESS / RAY_ADDRESS or the local cluster.",
    )

    @model_validator(mode="after")
    def _keys_fit_the_target(self):
        target = self.target
        if self.storage is not None and not self.storage.startswith("/"):
            raise ValueError(
                f"launch.storage = {self.storage!r} is not an absolute path; set it to where the shared file system "
                'is mounted on every node ("/shared")'
            )
        if target == "local":  # trains here; the other keys wait for a target (a spec may keep them while it trains here)
            return self
        for key in sorted(self.model_fields_set):
            targets = LAUNCH_TARGET_KEYS.get(key)
            if targets is not None and target not in targets:
                raise ValueError(
                    f"launch.{key} is for launch.target = {' or '.join(chr(34) + t + chr(34) for t in targets)}, "
                    f'not "{target}"; remove launch.{key}'
                )
        for key in LAUNCH_REQUIRED.get(target, ()):
            if getattr(self, key) is None:
                raise ValueError(
                    f'launch.target = "{target}" needs launch.{key}: set it to the container image the nodes run ("registry/name:tag")'
                )
        if self.storage_bucket is not None:
            _check_bucket_mount(self.storage_bucket, self.storage, self.storage_shared)
        return self


def _check_bucket_mount(url: str, storage: str | None, shared: bool) -> None:
    """launch.storage_bucket is mounted at launch.storage, and says what launch.storage_shared would say too."""
    if storage is None:
        raise ValueError(
            f"launch.storage_bucket = {url!r} has no mount path: set launch.storage to where the bucket is mounted "
            'on every node ("/shared") and output.dir to a folder under it ("/shared/runs/NAME")'
        )
    if shared:
        raise ValueError(
            f"launch.storage_bucket = {url!r} and launch.storage_shared = true both say what launch.storage is: "
            "remove launch.storage_shared to mount the bucket there, or launch.storage_bucket if the nodes already share it"
        )


class VisionSpec(_Section):
    """A vision-language model (model_type qwen2_vl, qwen2_5_vl, mllama, gemma3, idefics3, smolvlm,
    llava, llava_next): the images each example holds, and whether the vision tower trains."""

    image_size: (
        Annotated[int, Field(ge=1, le=65_536)]
        | Annotated[list[Annotated[int, Field(ge=1, le=65_536)]], Field(min_length=2, max_length=2)]
        | None
    ) = Field(
        None,
        description="Pixel size of the images before the processor resizes them: a side (square) or [width, height]; required for a VLM.",
    )
    images_per_example: Annotated[int, Field(ge=0, le=1024)] | Auto = Field(
        "auto", description="Images in each example, each in seq_len as its image tokens; auto: 1 for a VLM."
    )
    train_tower: bool = Field(
        False,
        description="Also train the vision tower and projector (lora: adapters on them too); default: only the language model trains.",
    )
    processor_config: PathStr | None = Field(
        None,
        description="A processor_config.json or preprocessor_config.json (relative to the spec); default: the model directory's.",
    )


class Spec(_Section):
    """A gpuplan spec, format 1."""

    model: ModelSpec
    lora: LoraSpec = Field(default_factory=LoraSpec)
    quantization: QuantizationSpec = Field(default_factory=QuantizationSpec)
    hardware: HardwareSpec = Field(default_factory=HardwareSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    preference: PreferenceSpec = Field(default_factory=PreferenceSpec)
    rl: RlSpec = Field(default_factory=RlSpec)
    distributed: DistributedSpec = Field(default_factory=DistributedSpec)
    output: OutputSpec = Field(default_factory=OutputSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    launch: LaunchSpec = Field(default_factory=LaunchSpec)
    vision: VisionSpec = Field(default_factory=VisionSpec)


SECTIONS: dict[str, type[BaseModel]] = {
    "model": ModelSpec,
    "lora": LoraSpec,
    "quantization": QuantizationSpec,
    "hardware": HardwareSpec,
    "data": DataSpec,
    "training": TrainingSpec,
    "preference": PreferenceSpec,
    "rl": RlSpec,
    "distributed": DistributedSpec,
    "output": OutputSpec,
    "eval": EvalSpec,
    "launch": LaunchSpec,
    "vision": VisionSpec,
}
