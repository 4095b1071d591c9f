"""The interface shared by the analytic estimate, the traced estimate and the solver.

Pure data, no torch. A `Workload` is what one device does in one optimizer step;
a `MemoryEstimate` is what that costs, part by part, at the peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

WeightDtype = Literal["float32", "bfloat16", "float16"]
Amp = Literal["fp16", "bf16"] | None
Attn = Literal["sdpa", "eager", "flash_attention_2"]
Task = Literal["causal-lm", "seq-cls", "masked-lm"]
Reference = Literal["none", "copy", "adapters-off", "precomputed"]  # the objective's reference (see Workload)

# Component names, in the order the plan prints them. They add up to
# reserved_peak_bytes; all but "overhead" add up to allocated_peak_bytes.
COMPONENTS = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "logits_loss",
    "temporaries",
    "overhead",
)


@dataclass(frozen=True)
class Adapters:
    """LoRA (peft) on a frozen base; qlora: the base's linear layers in bitsandbytes 4-bit."""

    method: str  # an adapter method of plan/methods.py: "lora" | "qlora"
    r: int
    target_modules: tuple[str, ...]  # resolved names peft matches (modelinfo/lora_targets.py)
    modules_to_save: tuple[str, ...] = ()
    use_dora: bool = False
    lora_dropout: float = 0.0
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # module prefixes peft's exclude_modules keeps adapters off (a VLM's frozen vision tower)
    excluded_modules: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Adapters:
        return cls(
            **{
                **d,
                "target_modules": tuple(d["target_modules"]),
                "modules_to_save": tuple(d.get("modules_to_save") or ()),
                "excluded_modules": tuple(d.get("excluded_modules") or ()),
            }
        )


@dataclass(frozen=True)
class Workload:
    """One device's share of an optimizer step."""

    per_device_batch: int
    seq_len: int
    gradient_accumulation_steps: int = 1
    weight_dtype: WeightDtype = "float32"
    amp: Amp = None
    optim: str = "adamw_torch"  # a transformers OptimizerNames value
    gradient_checkpointing: bool = False
    attn_implementation: Attn = "sdpa"
    task: Task = "causal-lm"
    num_labels: int = 2
    device: Literal["cuda", "cpu"] = "cuda"
    torch_empty_cache_steps: int = 0
    loss_chunk_size: int = 0  # tokens per chunk of the head + loss (memory/loss_chunking.py); 0 = off
    liger_kernel: bool = False  # Liger's fused linear cross-entropy and kernels (memory/liger.py)
    offload_activations: bool = False  # saved tensors in pinned host RAM (memory/offload_activations.py)
    # Scale-out: what the data-parallel ranks share. ZeRO (Rajbhandari et al. 2020)
    # stage 1 shards optimizer states, stage 2 also gradients, stage 3 also parameters;
    # FSDP SHARD_GRAD_OP ~ stage 2, FULL_SHARD ~ stage 3 (HYBRID_SHARD: within a node).
    engine: Literal["none", "ddp", "fsdp", "deepspeed"] = "none"
    shard_world_size: int = 1  # ranks the states are sharded over
    zero_stage: Literal[0, 1, 2, 3] = 0
    offload_optimizer: bool = False  # optimizer states and step in host RAM
    offload_params: bool = False  # parameters (and gradients) in host RAM between uses
    adapters: Adapters | None = None  # LoRA / QLoRA: only the adapters train (memory/adapters.py)
    # whole examples packed with position ids restarting per example (chat / instruction packing):
    # transformers builds a (b, 1, s, s) mask from them (memory/packed_mask.py prices it)
    packed: bool = False
    # The objective (spec/objectives.py): per_device_batch counts examples; dpo runs 2 sequences
    # per example. reference: none | copy (a frozen model in the compute dtype) | adapters-off
    # (peft disables the adapters: no second copy) | precomputed (log-probs computed before training)
    objective: str = "sft"
    reference: Reference = "none"
    # the KTO loss (preference.loss_type), set for kto only: apo_zero_unpaired runs no KL forwards
    # (spec/objectives.py objective); None: the objective's default loss
    loss_type: str | None = None
    # a vision-language model (memory/vision.py): images per example, each `image_tokens` of the
    # seq_len tokens; the tower encodes `tower_images` images of `tower_tokens` tokens per image;
    # train_tower: its weights (or adapters) train, else it runs frozen, without saving activations
    images_per_example: int = 0
    image_tokens: int = 0
    tower_images: int = 0
    tower_tokens: int = 0
    train_tower: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.objective == "sft":  # an SFT plan's JSON stays what it was before objectives existed
            del d["objective"], d["reference"]
        if self.loss_type is None:  # nor a DPO plan's
            del d["loss_type"]
        if d["adapters"] is not None and not d["adapters"]["excluded_modules"]:  # nor a text model's
            del d["adapters"]["excluded_modules"]
        for k in ("images_per_example", "image_tokens", "tower_images", "tower_tokens", "train_tower"):
            if not d[k]:  # a text model's
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Workload:
        a = d.get("adapters")
        return cls(**{**d, "adapters": Adapters.from_dict(a) if a else None})


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak memory of one device in bytes.

    allocated_peak_bytes: what torch.cuda.max_memory_allocated() would show.
    reserved_peak_bytes: what nvidia-smi would show (allocated + allocator
    reserve + CUDA context + cuBLAS workspace).
    components: the parts at the peak, bytes; see COMPONENTS.
    """

    allocated_peak_bytes: int
    reserved_peak_bytes: int
    components: Mapping[str, int]
    method: Literal["analytic", "traced"]
    notes: tuple[str, ...] = field(default_factory=tuple)
    host_bytes: int = 0  # offloaded to host RAM (scale-out offload); not in the device figures
    offloaded_activation_bytes: int = 0  # of host_bytes: activations per micro-batch (memory/offload_activations.py)
    host_pinned_bytes: int = 0  # of host_bytes, page-locked

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "components": {k: int(self.components.get(k, 0)) for k in COMPONENTS},
            "method": self.method,
            "notes": list(self.notes),
            "host_bytes": self.host_bytes,
            "offloaded_activation_bytes": self.offloaded_activation_bytes,
            "host_pinned_bytes": self.host_pinned_bytes,
        }
