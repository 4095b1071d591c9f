"""The plan's resolved settings as typed, frozen sections: what apply, after and trace read.

`Plan.settings` maps key paths ("training.seed") to Settings with their provenance; that is the
plan's record and what `plan.json` holds. `Resolved` is the same values once more, converted and
checked once when the Plan is built (Plan.__post_init__, so a loaded plan.json gets them too):
`plan.resolved.training.seed` is an int, `plan.resolved.model.method` the method's descriptor
(gpuplan/plan/methods.py), `plan.resolved.training.objective` the objective's
(gpuplan/spec/objectives.py). A missing key, an unknown one (a typo) or a value of the wrong type
is an error naming the key, the value and the fix, when the plan is assembled or loaded, not in the
middle of a run.

"auto" is resolved here: the planner resolves every "auto" a run reads; a key it leaves "auto" is
one the plan does not use (distributed.zero_stage without DeepSpeed, the 4-bit compute dtype without
a 4-bit base, preference.* under sft), and reads as None.

The sections mirror the spec's (gpuplan/spec/schema.py), with the planner's derived keys
(model.commit, data.commit: Hub ids only).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.hub.fetch import DatasetRef, ModelRef
from gpuplan.plan.methods import METHODS, Method, method_named
from gpuplan.spec.objectives import OBJECTIVES, Objective

__all__ = [
    "DataSettings",
    "DistributedSettings",
    "EvalSettings",
    "HardwareSettings",
    "LaunchSettings",
    "LoraSettings",
    "ModelSettings",
    "OutputSettings",
    "PreferenceRun",
    "PreferenceSettings",
    "QuantizationSettings",
    "Resolved",
    "RewardEntry",
    "RlSettings",
    "TrainingSettings",
    "VisionSettings",
    "resolve_settings",
]

_FIX = "re-run `gpuplan plan` on the spec to write a complete plan"


def _unused_when_auto(default: Any = MISSING) -> Any:
    """A key the planner leaves "auto" when the plan does not use it: "auto" reads as None."""
    return field(default=default, metadata={"auto": None})


def _converted(convert: Callable[[Any], Any], names: Callable[[], Any]) -> Any:
    """A field whose plan value (one of `names()`) `convert` turns into its descriptor."""
    return field(metadata={"convert": convert, "names": names})


def _absent_as_none() -> Any:
    """A derived key only some plans carry (Hub ids only: model.commit, data.commit)."""
    return field(default=None)


def _method(name: Any) -> Method:
    if not isinstance(name, str):
        raise TypeError
    return method_named(name)


def _objective(name: Any) -> Objective:
    if not isinstance(name, str):
        raise TypeError
    return OBJECTIVES[name]


@dataclass(frozen=True)
class ModelSettings:
    SECTION: ClassVar[str] = "model"

    config: str | None
    name_or_path: str | None
    from_scratch: bool
    task: Literal["causal-lm", "seq-cls", "masked-lm"]
    num_labels: int | None
    dtype: Literal["float32", "bfloat16", "float16"]
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"]
    trust_remote_code: bool
    allow_pickle_weights: bool
    revision: str
    method: Method = _converted(_method, lambda: METHODS)  # model.method, as its descriptor (plan/methods.py)
    commit: str | None = _absent_as_none()

    @property
    def hub(self) -> ModelRef:
        """model.name_or_path with its resolved commit, as gpuplan.hub.fetch takes it."""
        return ModelRef(self.name_or_path, self.commit, self.allow_pickle_weights)


@dataclass(frozen=True)
class LoraSettings:
    SECTION: ClassVar[str] = "lora"

    r: int
    lora_alpha: int | None
    lora_dropout: float
    target_modules: str | tuple[str, ...]  # "all-linear" or module names
    use_dora: bool
    modules_to_save: tuple[str, ...] | None


@dataclass(frozen=True)
class QuantizationSettings:
    SECTION: ClassVar[str] = "quantization"

    bnb_4bit_quant_type: Literal["nf4", "fp4"]
    bnb_4bit_use_double_quant: bool
    bnb_4bit_compute_dtype: Literal["bfloat16", "float16", "float32"] | None = _unused_when_auto()  # None: no 4-bit base


@dataclass(frozen=True)
class HardwareSettings:
    SECTION: ClassVar[str] = "hardware"

    gpu: str
    count: int
    nodes: int
    memory_gib: float | None
    headroom: float
    host_memory_gib: float | None
    cpu_count: int | None
    price_per_hour: float | None
    interconnect: Literal["nvlink", "pcie"] | None = _unused_when_auto()  # None: the GPU profile's
    network: Literal["infiniband-ndr", "infiniband-hdr", "ethernet-100g"] | None = _unused_when_auto()  # None: the catalog's

    @property
    def world_size(self) -> int:
        """Processes the plan runs as: GPUs per node x nodes."""
        return self.count * self.nodes


@dataclass(frozen=True)
class DataSettings:
    SECTION: ClassVar[str] = "data"

    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    eval_fraction: float
    text_field: str
    label_field: str | None
    seq_len: int
    packing: bool
    dataset: str | None
    revision: str
    split: str
    format: Literal["text", "chat", "instruction"]
    messages_field: str
    chat_template: str | None
    prompt_field: str
    response_field: str
    prompt_template: str
    train_on_prompt: bool
    commit: str | None = _absent_as_none()

    @property
    def hub(self) -> DatasetRef:
        """data.dataset with its resolved commit and split, as gpuplan.hub.fetch takes it."""
        return DatasetRef(self.dataset, self.commit, self.split)

    @property
    def has_eval(self) -> bool:
        """An evaluation split: eval files, or a fraction of the training data held out."""
        return bool(self.eval_files) or self.eval_fraction > 0.0


@dataclass(frozen=True)
class TrainingSettings:
    SECTION: ClassVar[str] = "training"

    effective_batch_size: int
    per_device_train_batch_size: int
    per_device_eval_batch_size: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    bf16: bool
    fp16: bool
    tf32: bool
    optim: str
    learning_rate: float
    max_steps: int | None
    num_train_epochs: float
    lr_scheduler_type: str
    warmup_steps: int | float  # a float below 1 where the plan turned warmup_ratio into a fraction
    warmup_ratio: float | None
    weight_decay: float
    max_grad_norm: float
    logging_steps: int
    save_steps: int
    save_total_limit: int | None
    eval_steps: int | None
    seed: int
    dataloader_pin_memory: bool
    dataloader_num_workers: int
    torch_compile: bool
    torch_compile_backend: str | None
    torch_compile_mode: str | None
    torch_empty_cache_steps: int
    loss_chunk_size: int
    activation_offloading: bool
    use_liger_kernel: bool
    report_to: str | tuple[str, ...]  # "none", "all", one tracker, or several
    run_name: str | None
    objective: Objective = _converted(_objective, lambda: OBJECTIVES)  # training.objective, as its descriptor (spec/objectives.py)
    warmup_derived: bool = False  # warmup_steps was written by the plan (from warmup_ratio), not the spec

    @property
    def warmup(self) -> int | float:
        """What TrainingArguments.warmup_steps gets: the steps, or warmup_ratio as the float in [0, 1)
        that transformers 5.24 reads as a ratio (both set is refused when the plan is built)."""
        if self.warmup_derived or self.warmup_ratio is None:
            return self.warmup_steps
        return self.warmup_ratio

    @property
    def trackers(self) -> tuple[str, ...]:
        """report_to as names ("none" and "all" included as written)."""
        return (self.report_to,) if isinstance(self.report_to, str) else self.report_to


@dataclass(frozen=True)
class PreferenceSettings:
    SECTION: ClassVar[str] = "preference"

    beta: float | None
    max_length: int | None
    max_prompt_length: int | None
    reference_model: str | None
    loss_type: str | None = _unused_when_auto()  # None: an sft plan
    reference: Literal["model", "copy", "adapters-off", "precomputed"] | None = _unused_when_auto()


@dataclass(frozen=True)
class PreferenceRun:
    """[preference] of a plan whose objective is one (dpo, kto): every value the trainer needs, set."""

    beta: float
    loss_type: str
    max_length: int
    max_prompt_length: int
    reference: Literal["model", "copy", "adapters-off", "precomputed"]
    reference_model: str | None


def _preference_run(p: PreferenceSettings, problems: list[Diagnostic]) -> PreferenceRun | None:
    """The preference settings a preference objective trains with; a None among them is a problem."""
    values = {f.name: getattr(p, f.name) for f in fields(PreferenceRun)}
    unset = [name for name, v in values.items() if v is None and name != "reference_model"]
    for name in unset:
        key = f"preference.{name}"
        problems.append(Diagnostic("error", key, f"{key} is not resolved in the plan of a preference objective", fix=_FIX))
    return None if unset else PreferenceRun(**values)


REWARD_KINDS = ("exact-match", "regex", "length", "function")


@dataclass(frozen=True)
class RewardEntry:
    """One [[rl.rewards]] table of the plan (spec/schema.py RewardSpec), every key present.

    kind "exact-match": 1.0 when the completion's answer (the first group of `pattern` searched in it, else the
    whole completion, stripped) equals str(row[column]).strip(), else 0.0; "regex": 1.0 when re.search(pattern,
    completion), else 0.0; "length": -max(0, completion tokens - target_length) / target_length; "function": the
    user function `function` ("/abs/path/file.py:name"), called with TRL's reward signature."""

    kind: Literal["exact-match", "regex", "length", "function"]
    weight: float
    name: str  # the metric's name (rewards/<name>/mean): the spec's, else the kind with - as _, or the function's name
    column: str | None = None
    pattern: str | None = None
    target_length: int | None = None
    function: str | None = None

    @property
    def function_file(self) -> str | None:
        """The Python file of a function reward (absolute), or None."""
        return None if self.function is None else self.function.rpartition(":")[0]

    @property
    def function_name(self) -> str | None:
        return None if self.function is None else self.function.rpartition(":")[2]


def _rewards(value: Any) -> tuple[RewardEntry, ...]:
    """rl.rewards of a plan: a list of tables -> RewardEntry, names defaulted and unique."""
    if not isinstance(value, list | tuple):
        raise TypeError
    out: list[RewardEntry] = []
    for d in value:
        if not isinstance(d, Mapping) or d.get("kind") not in REWARD_KINDS:
            raise TypeError
        name = d.get("name") or (str(d["function"]).rpartition(":")[2] if d.get("function") else d["kind"].replace("-", "_"))
        weight, target = d.get("weight", 1.0), d.get("target_length")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or (target is not None and type(target) is not int):
            raise TypeError
        for key in ("column", "pattern", "function"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise TypeError
        out.append(RewardEntry(d["kind"], float(weight), name, d.get("column"), d.get("pattern"), target, d.get("function")))
    return tuple(out)


@dataclass(frozen=True)
class RlSettings:
    """[rl] of a plan (TRL GRPOConfig / RLOOConfig names, trl 1.16). Under an sft / dpo / kto plan every "auto"
    reads as None and nothing here is used; under grpo / rloo the rules resolve every one."""

    SECTION: ClassVar[str] = "rl"

    max_prompt_length: int | None  # None: not an RL plan
    max_completion_length: int
    temperature: float
    top_p: float
    beta: float | None  # None: not an RL plan
    generation_backend: Literal["transformers", "vllm-colocate", "vllm-server"]
    vllm_tensor_parallel_size: int
    vllm_enable_sleep_mode: bool
    vllm_server_gpus: int | None  # vllm-server: the server's GPUs besides hardware.count; else None
    rewards: tuple[RewardEntry, ...] = field(metadata={"convert": _rewards, "names": lambda: ("a list of reward tables",)})
    num_generations: int | None = _unused_when_auto()
    loss_type: str | None = _unused_when_auto()  # rloo: None (RLOOConfig has no loss_type)
    generation_batch_size: int | None = _unused_when_auto()  # completions per generation round, all GPUs
    vllm_gpu_memory_utilization: float | None = _unused_when_auto()  # vllm-colocate only
    reference: Literal["none", "copy", "adapters-off"] | None = _unused_when_auto()

    @property
    def use_vllm(self) -> bool:
        return self.generation_backend != "transformers"

    @property
    def vllm_mode(self) -> Literal["colocate", "server"] | None:
        """GRPOConfig.vllm_mode, or None with transformers generation."""
        return {"vllm-colocate": "colocate", "vllm-server": "server"}.get(self.generation_backend)  # type: ignore[return-value]

    @property
    def sequence_length(self) -> int | None:
        """Prompt + completion tokens of the longest sequence the step runs."""
        return None if self.max_prompt_length is None else self.max_prompt_length + self.max_completion_length

    @property
    def reward_weights(self) -> list[float]:
        return [r.weight for r in self.rewards]


def _rl_complete(rl: RlSettings, objective: Objective, problems: list[Diagnostic]) -> None:
    """Under grpo / rloo every value the trainer reads is resolved."""
    need = ["num_generations", "generation_batch_size", "beta", "max_prompt_length", "reference"]
    if objective.loss_types:
        need.append("loss_type")
    if rl.generation_backend == "vllm-colocate":
        need.append("vllm_gpu_memory_utilization")
    for name in need:
        if getattr(rl, name) is None:
            key = f"rl.{name}"
            problems.append(Diagnostic("error", key, f"{key} is not resolved in the plan of an RL objective", fix=_FIX))
    if not rl.rewards:
        problems.append(Diagnostic("error", "rl.rewards", "the plan of an RL objective has no rl.rewards", fix=_FIX))


@dataclass(frozen=True)
class DistributedSettings:
    SECTION: ClassVar[str] = "distributed"

    strategy: Literal["none", "ddp", "fsdp", "deepspeed"]
    fsdp_sharding: Literal["full_shard", "shard_grad_op", "hybrid_shard"]
    fsdp_cpu_offload: bool
    offload_optimizer: bool
    offload_params: bool
    master_addr: str | None
    master_port: int
    zero_stage: Literal[1, 2, 3] | None = _unused_when_auto()  # None: not DeepSpeed

    @property
    def sharded(self) -> bool:
        """FSDP or DeepSpeed: the parameters are split over the ranks."""
        return self.strategy in ("fsdp", "deepspeed")


@dataclass(frozen=True)
class OutputSettings:
    SECTION: ClassVar[str] = "output"

    dir: str
    merge_adapter: bool


@dataclass(frozen=True)
class EvalSettings:
    SECTION: ClassVar[str] = "eval"

    tasks: tuple[str, ...]
    include_path: str | None
    num_fewshot: int | None
    limit: int | float | None  # lm-eval's limit: examples per task, or a fraction of them
    sample_prompts: tuple[str, ...]
    sample_max_new_tokens: int
    sample_at_eval: bool


@dataclass(frozen=True)
class LaunchSettings:
    """[launch]: where apply runs the plan (gpuplan/clusters/). Every field has a default, so plans
    saved before the section existed load as launch.target = "local"."""

    SECTION: ClassVar[str] = "launch"

    target: Literal["local", "slurm", "kubernetes", "skypilot", "ray"] = "local"
    storage: str | None = None  # the shared file system's mount path on every node
    time_margin: float = 0.25  # fraction added to the high end of the planned run time
    startup_minutes: int = 10
    time_limit_minutes: int | None = None  # a fixed limit instead of the planned one
    gpuplan_command: str = "gpuplan"
    job_name: str | None = None
    partition: str | None = None  # slurm
    account: str | None = None  # slurm
    qos: str | None = None  # slurm
    image: str | None = None  # kubernetes, skypilot
    namespace: str | None = None  # kubernetes
    queue: str | None = None  # kubernetes: Kueue LocalQueue
    kubernetes_api: Literal["trainjob", "job"] = "trainjob"
    storage_claim: str | None = None  # kubernetes: the PVC mounted at storage
    spot: bool = False  # skypilot: managed job on spot instances
    storage_bucket: str | None = None  # skypilot: the bucket mounted at storage (MOUNT_CACHED)
    storage_shared: bool = False  # skypilot: storage is already a shared mount on every node
    ray_address: str | None = None  # ray: the GCS address ray.init joins
    ray_dashboard_address: str | None = None  # ray: the dashboard's http(s) address the job client reaches

    @property
    def remote(self) -> bool:
        """The plan is handed off to a cluster rather than trained here."""
        return self.target != "local"

    @property
    def on_bucket(self) -> bool:
        """output.dir is on a cloud bucket mounted with write-back (spec/buckets.py): a checkpoint may be half uploaded."""
        return self.target == "skypilot" and self.storage_bucket is not None


@dataclass(frozen=True)
class VisionSettings:
    """[vision] of the spec and what the plan derives for a vision-language model
    (plan/vision_settings.py); every field has a text-only default, so a text plan has none of them."""

    SECTION: ClassVar[str] = "vision"

    image_size: int | tuple[int, ...] | None = None  # the spec's: a side, or (width, height)
    images_per_example: int = field(default=0, metadata={"auto": 0})  # "auto" stays in a text plan: none
    train_tower: bool = False
    processor_config: str | None = None  # the processor config the image tokens were counted with (a file or the model directory)
    # derived by the plan (None / () / 0 for a text-only model):
    family: str | None = None  # the VLM's model_type; apply builds AutoModelForImageTextToText + AutoProcessor
    image_tokens: int = 0  # tokens one image of image_size takes in input_ids, as the processor inserts them
    image_token_id: int | None = None  # the config's image placeholder token
    tower_modules: tuple[str, ...] = ()  # module-name prefixes (transformers 5.24 names)
    projector_modules: tuple[str, ...] = ()
    language_model_modules: tuple[str, ...] = ()
    frozen_modules: tuple[str, ...] = ()  # full: requires_grad False under them; lora/qlora: no adapters there
    lora_exclude: str | None = None  # peft LoraConfig(exclude_modules=...): a regex re.fullmatch-ed per module name

    @property
    def is_vlm(self) -> bool:
        return self.family is not None


@dataclass(frozen=True)
class Resolved:
    """Every resolved setting of a plan, by section."""

    model: ModelSettings
    lora: LoraSettings
    quantization: QuantizationSettings
    hardware: HardwareSettings
    data: DataSettings
    training: TrainingSettings
    preference: PreferenceSettings
    rl: RlSettings
    distributed: DistributedSettings
    output: OutputSettings
    eval: EvalSettings
    launch: LaunchSettings = LaunchSettings()
    vision: VisionSettings = field(default_factory=VisionSettings)
    preference_run: PreferenceRun | None = None  # set exactly when training.objective is a preference one


_SECTIONS: dict[str, Any] = {}  # section name -> its class, filled below


class _WrongType(Exception):
    pass


def _expected(tp: Any) -> str:
    """A type as the error names it."""
    origin = get_origin(tp)
    if tp is type(None):
        return "none"
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_expected(get_args(tp)[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _convert(value: Any, tp: Any) -> Any:
    """`value` as type `tp` (bool, int, float, str, None, Literal, tuple[X, ...], unions of them); _WrongType otherwise."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for arm in get_args(tp):
            try:
                return _convert(value, arm)
            except _WrongType:
                continue
        raise _WrongType
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in get_args(tp)):
            return value
        raise _WrongType
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _WrongType
        return tuple(_convert(v, get_args(tp)[0]) for v in value)
    if tp is type(None):
        if value is None:
            return None
        raise _WrongType
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _WrongType
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _WrongType
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _WrongType
    if tp is str:
        if isinstance(value, str):
            return value
        raise _WrongType
    raise TypeError(f"resolved.py: no conversion for {tp!r}")


@functools.cache
def _names_of(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


@functools.cache
def _fields_of(cls: type) -> tuple[tuple[Any, Any], ...]:
    """(dataclass field, its resolved type) of a section, computed once (get_type_hints evaluates the annotations)."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in fields(cls))


def _section(cls: Any, values: Mapping[str, Any], problems: list[Diagnostic]) -> Any:
    kw: dict[str, Any] = {}
    for f, tp in _fields_of(cls):
        key = f"{cls.SECTION}.{f.name}"
        if f.name not in values:
            if f.default is MISSING:
                problems.append(Diagnostic("error", key, f"the plan has no {key}", fix=_FIX))
            continue
        value = values[f.name]
        if value == "auto" and "auto" in f.metadata:
            kw[f.name] = f.metadata["auto"]
            continue
        try:
            if "convert" in f.metadata:
                kw[f.name] = f.metadata["convert"](value)
            else:
                kw[f.name] = _convert(value, tp)
        except (_WrongType, TypeError, KeyError):
            want = " | ".join(repr(n) for n in f.metadata["names"]()) if "convert" in f.metadata else _expected(tp)
            problems.append(Diagnostic("error", key, f"{key} = {value!r} in the plan is not {want}", fix=_FIX))
    return None if problems else cls(**kw)


def resolve_settings(values: Mapping[str, Any], *, warmup_derived: bool = False) -> Resolved:
    """The typed sections of a plan's settings ({key path: value}); GpuplanError names every
    missing, unknown or wrongly-typed key."""
    by_section: dict[str, dict[str, Any]] = {}
    problems: list[Diagnostic] = []
    for key, value in values.items():
        section, _, name = key.partition(".")
        cls = _SECTIONS.get(section)
        known = cls is not None and name in _names_of(cls) and name != "warmup_derived"
        if not known:
            problems.append(Diagnostic("error", key, f"the plan has an unknown key {key}", fix=_FIX))
            continue
        by_section.setdefault(section, {})[name] = value
    by_section.setdefault("training", {})["warmup_derived"] = warmup_derived
    training = by_section["training"]
    ratio, steps = training.get("warmup_ratio"), training.get("warmup_steps")
    if not warmup_derived and ratio is not None and steps:
        problems.append(
            Diagnostic(
                "error",
                "training.warmup_ratio",
                f"training.warmup_steps = {steps!r} and training.warmup_ratio = {ratio!r} are both set",
                fix="keep one of them in the spec and re-run `gpuplan plan`",
            )
        )
    built = {}
    for f in fields(Resolved):
        if f.name not in _SECTIONS:
            continue
        cls = _SECTIONS[f.name]
        section_problems: list[Diagnostic] = []
        built[f.name] = _section(cls, by_section.get(f.name, {}), section_problems)
        problems += section_problems
    if not problems and built["training"].objective.is_preference:
        built["preference_run"] = _preference_run(built["preference"], problems)
    if not problems and built["training"].objective.is_rl:
        _rl_complete(built["rl"], built["training"].objective, problems)
    if problems:
        raise GpuplanError(problems)
    return Resolved(**built)


_SECTIONS.update({name: cls for name, cls in typing.get_type_hints(Resolved).items() if name != "preference_run"})
