"""The memory model: bytes per GPU, part by part, without torch.

estimate.py     the estimate: states + activations + overhead for one Workload
types.py        Workload (what is trained, how) and MemoryEstimate (the parts)
layout.py       parameter counts per dtype and per unit, from modelinfo facts
states.py       weights, gradients, optimizer states (AdamW, 8-bit, Adafactor, SGD)
sharding.py     per-GPU states under DDP, FSDP and DeepSpeed ZeRO
activations.py  activations and the loss path per family
overhead.py     what the device adds beyond tensors (context, allocator, workspace)
"""

from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.types import COMPONENTS, MemoryEstimate, Workload

__all__ = ["COMPONENTS", "MemoryEstimate", "Workload", "estimate_memory"]
