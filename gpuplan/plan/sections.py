"""The typed sections of a Plan: hardware, model, memory, throughput.

Each is a frozen value whose fields are the keys of its JSON object, in the order
`gpuplan plan --json` prints them, so the JSON contract lives here and nowhere else.
`from_dict` takes what `to_dict` wrote (a missing key reads as None, for plans built
by hand or saved before a field existed); an unknown key is an error, so a field added
in build.py without a field here fails loudly instead of vanishing from saved plans.
Nested parts whose keys vary (peak_tflops, components, communication ...) stay mappings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from gpuplan.plan.estimate.memory.types import COMPONENTS, Workload


def _load(cls, d: Mapping[str, Any], convert: Mapping[str, Any]) -> Any:
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"{cls.SECTION}: unknown key(s) {', '.join(unknown)} (known: {', '.join(names)})")
    kw = {}
    for n in names:
        if n in d:
            v = d[n]
            kw[n] = convert[n](v) if n in convert and v is not None else v
    return cls(**kw)


def _dump(obj: Any, convert: Mapping[str, Any], omit_none: tuple[str, ...] = ()) -> dict[str, Any]:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if v is None and f.name in omit_none:
            continue
        out[f.name] = convert[f.name](v) if f.name in convert and v is not None else v
    return out


def _tuple(v: Any) -> tuple:
    return tuple(v)


def _list(v: Any) -> list:
    return list(v)


def _dict(v: Any) -> dict:
    return dict(v)


@dataclass(frozen=True)
class HardwareSection:
    """The GPU profile the plan is for (gpuplan.hardware.profile.GPUProfile.to_dict) and how many."""

    SECTION: ClassVar[str] = "hardware"

    name: str | None = None
    vendor: str | None = None  # "nvidia" | "amd" | "cpu"
    memory_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    bf16: bool | None = None
    tf32: bool | None = None
    fp8: bool | None = None
    peak_tflops: Mapping[str, float] | None = None  # dtype -> dense TFLOP/s
    memory_bandwidth_gbps: float | None = None
    interconnect: Mapping[str, float] | None = None  # "nvlink"/"pcie" -> GB/s
    aliases: tuple[str, ...] | None = None
    datasheet_gb: float | None = None  # the capacity the datasheet prints; memory_bytes is the usable one
    matmul_max: float | None = None  # the SKU's fastest measured GEMM / its dense 16-bit peak (GPUProfile.matmul_max)
    count: int = 1  # GPUs per node
    nodes: int = 1

    _IN: ClassVar = {"compute_capability": _tuple, "aliases": _tuple}
    _OUT: ClassVar = {"compute_capability": _list, "aliases": _list, "peak_tflops": _dict, "interconnect": _dict}

    @property
    def is_cpu(self) -> bool:
        return self.vendor == "cpu"

    @property
    def world_size(self) -> int:
        return self.count * self.nodes

    def to_dict(self) -> dict[str, Any]:
        return _dump(self, self._OUT, omit_none=("matmul_max",))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HardwareSection:
        return _load(cls, d, cls._IN)


@dataclass(frozen=True)
class ModelSection:
    """The model's summary (gpuplan.modelinfo.facts.ModelFacts.summary)."""

    SECTION: ClassVar[str] = "model"

    model_type: str | None = None
    task: str | None = None
    n_params: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    source: str | None = None  # where the parameter count came from
    notes: tuple[str, ...] = ()
    # mixture of experts only (modelinfo: FLOPs count the routed experts, memory all of them)
    num_experts: int | None = None
    experts_per_token: int | None = None
    active_params: int | None = None
    # what is trained (issue 12): peft's get_nb_trainable_parameters figures; adapters only for lora/qlora
    method: str | None = None  # "full" | "lora" | "qlora"
    trainable_params: int | None = None
    total_params: int | None = None
    adapters: Mapping[str, Any] | None = None  # per_target, saved_params, enable_input_require_grads ...
    # a vision-language model: tower / projector / language-model parameters (modelinfo VisionFacts.summary)
    vision: Mapping[str, Any] | None = None

    _IN: ClassVar = {"notes": _tuple}
    _OUT: ClassVar = {"notes": _list, "adapters": _dict, "vision": _dict}
    _OPTIONAL: ClassVar = ("num_experts", "experts_per_token", "active_params", "adapters", "vision")

    def to_dict(self) -> dict[str, Any]:
        return _dump(self, self._OUT, omit_none=self._OPTIONAL)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSection:
        return _load(cls, d, cls._IN)


@dataclass(frozen=True)
class Saver:
    """A memory saver the plan turned on, what it saves and what it costs."""

    name: str
    saved_bytes: int | None
    cost: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "saved_bytes": self.saved_bytes, "cost": self.cost}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Saver:
        return cls(d["name"], d.get("saved_bytes"), d["cost"])


def _savers_in(v: Any) -> tuple[Saver, ...]:
    return tuple(s if isinstance(s, Saver) else Saver.from_dict(s) for s in v)


def _savers_out(v: Any) -> list[dict[str, Any]]:
    return [s.to_dict() for s in v]


def _components_in(v: Any) -> Mapping[str, int] | None:
    """The parts in the estimate's order (COMPONENTS), as the plan prints them: a state file is
    written with sorted keys (lifecycle/state.py), and `show` would list them alphabetically."""
    if v is None:
        return None
    return {k: v[k] for k in (*COMPONENTS, *sorted(set(v) - set(COMPONENTS))) if k in v}


def _workload_in(v: Any) -> Workload:
    return v if isinstance(v, Workload) else Workload.from_dict(v)


@dataclass(frozen=True)
class MemorySection:
    """Peak memory per device of the workload the plan runs, against the device's capacity."""

    SECTION: ClassVar[str] = "memory"

    allocated_peak_bytes: int | None = None  # torch.cuda.max_memory_allocated
    reserved_peak_bytes: int | None = None  # nvidia-smi
    capacity_bytes: int | None = None
    usable_bytes: int | None = None  # capacity less headroom
    headroom: float | None = None  # fraction of capacity kept free
    fits: bool | None = None
    components: Mapping[str, int] | None = None  # see gpuplan.plan.estimate.memory.types.COMPONENTS
    host_bytes: int | None = None  # offloaded to host RAM, per GPU
    host: Mapping[str, Any] | None = None  # host RAM per node: plan/estimate/memory/host.py HostMemory.to_dict
    layout: str | None = None  # "single device", "FSDP full shard over 8" ...
    savers: tuple[Saver, ...] = ()
    notes: tuple[str, ...] = ()
    workload: Workload | None = None
    method: str | None = None  # "analytic" | "traced"
    traced: Mapping[str, Any] | None = None  # `gpuplan plan --trace` only; absent from the JSON otherwise

    _IN: ClassVar = {"savers": _savers_in, "notes": _tuple, "workload": _workload_in, "components": _components_in}
    _OUT: ClassVar = {
        "savers": _savers_out,
        "notes": _list,
        "workload": Workload.to_dict,
        "components": _dict,
        "traced": _dict,
        "host": _dict,
    }

    def to_dict(self) -> dict[str, Any]:
        return _dump(self, self._OUT, omit_none=("traced", "host"))

    @property
    def host_ram_needed_bytes(self) -> int | None:
        """Host RAM per node when it is a requirement of the plan, not a by-product: states offloaded
        to it, or the whole 4-bit base loaded into it on every rank (estimate/memory/host.py); else None."""
        h = self.host
        if h and (h.get("offloaded_bytes") or self.host_bytes or "4-bit base into host" in h.get("loading", "")):
            return int(h["peak_bytes"])
        return None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemorySection:
        return _load(cls, d, cls._IN)


@dataclass(frozen=True)
class ThroughputSection:
    """Step time and tokens per second (gpuplan.plan.estimate.throughput, gpuplan.plan.estimate.comm_time)."""

    SECTION: ClassVar[str] = "throughput"

    tokens_per_step: int | None = None
    model_flops_per_token: int | None = None
    flops_per_token: int | None = None
    model_flops_per_step: int | None = None
    flops_per_step: int | None = None
    flops_formula: str | None = None
    world_size: int | None = None
    peak_dtype: str | None = None
    peak_tflops: float | None = None
    utilisation: float | None = None
    assumption: str | None = None
    slowdowns: Mapping[str, float] | None = None
    saver_seconds: Mapping[str, float] | None = None  # memory saver -> seconds it adds per step
    step_time_s: float | None = None  # compute plus communication
    tokens_per_second: float | None = None
    max_steps: int | None = None
    run_time_s: float | None = None
    notes: tuple[str, ...] = ()
    compute_step_time_s: float | None = None
    communication: Mapping[str, Any] | None = None  # data-parallel traffic per step; keys vary by layout
    calibration: Mapping[str, Any] | None = None  # the measured run the efficiency came from (plan/estimate/calibration.py)
    price_per_gpu_hour: float | None = None  # USD, on demand (hardware/prices.py)
    price_source: str | None = None
    cost_usd: float | None = None  # run time x GPUs x price
    step_time: Mapping[str, Any] | None = None  # the step-time model's terms, shares and bound (plan/estimate/step_time)
    # low/high step time, run time and cost from the model's cross-validated spread (plan/estimate/interval.py):
    # {"low_factor", "high_factor", "step_time_s": [lo, hi], "run_time_s": [lo, hi] | None, "cost_usd": [lo, hi] | None,
    # "basis"}; factors None (and no ranges) where the plan carries no interval (calibrated, CPU, given utilisation)
    time_interval: Mapping[str, Any] | None = None

    _IN: ClassVar = {"notes": _tuple}
    _OUT: ClassVar = {
        "notes": _list,
        "slowdowns": _dict,
        "saver_seconds": _dict,
        "communication": _dict,
        "calibration": _dict,
        "step_time": _dict,
        "time_interval": _dict,
    }

    @property
    def empty(self) -> bool:
        return self.tokens_per_step is None

    def to_dict(self) -> dict[str, Any]:
        return _dump(self, self._OUT)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThroughputSection:
        return _load(cls, d, cls._IN)
