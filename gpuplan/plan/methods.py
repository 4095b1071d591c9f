"""The training methods as descriptors: what is trained and how the base is stored.

The method (full, lora, qlora) is one axis of a run; the objective (what the loss is:
supervised fine-tuning today) is another, independent one. Rules, the cost models and apply
read these fields instead of comparing method names, so a new method is one entry here
plus its memory model.

Sources: LoRA (Hu et al. 2021) trains low-rank adapters beside a frozen base; QLoRA
(Dettmers et al. 2023) stores that base in 4-bit NF4 (bitsandbytes Linear4bit). A frozen
base computes input gradients but no weight gradients: 2N forward + 2N backward matmul
FLOPs per token instead of 2N + 4N (Kaplan et al. 2020's 6N).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuplan.plan.estimate.memory.types import Adapters


@dataclass(frozen=True)
class Method:
    name: str  # model.method
    frozen_base: bool  # the base weights get no gradients and no optimizer states
    quantized_base: bool  # the base's linear layers are bitsandbytes 4-bit
    weight_flops: int  # matmul FLOPs per weight per trained token: 6 trains the weights, 4 freezes them
    engines: frozenset[str]  # the distributed engines gpuplan plans it under
    sections: tuple[str, ...]  # spec sections that shape what it trains

    def trains(self, key: str) -> bool:
        """Whether a spec key shapes what this method trains: [lora] only with adapters,
        [quantization] only with a 4-bit base (full plans carry both sections' defaults)."""
        section = key.split(".", 1)[0]
        return section not in ADAPTER_SECTIONS or section in self.sections


ADAPTER_SECTIONS = ("lora", "quantization")
FULL = Method("full", False, False, 6, frozenset({"none", "ddp", "fsdp", "deepspeed"}), ())
# adapters shard like full models: the frozen base and the adapters' states part by part under FSDP
# and DeepSpeed ZeRO (estimate/memory/adapters_sharded.py)
LORA = Method("lora", True, False, 4, frozenset({"none", "ddp", "fsdp", "deepspeed"}), ("lora",))
QLORA = Method("qlora", True, True, 4, frozenset({"none", "ddp", "fsdp", "deepspeed"}), ("lora", "quantization"))

METHODS: dict[str, Method] = {m.name: m for m in (FULL, LORA, QLORA)}
ADAPTER_METHODS: tuple[Method, ...] = tuple(m for m in METHODS.values() if m.frozen_base)


def method_named(name: str | None) -> Method:
    """The descriptor of model.method (plans made before adapters existed carry none: full)."""
    return METHODS[name or "full"]


def method_of(adapters: Adapters | None) -> Method:
    """The method a memory Workload trains with: its adapters say which, none is full."""
    return FULL if adapters is None else METHODS[adapters.method]
