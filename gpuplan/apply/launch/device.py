"""The device a plan runs on, checked before anything loads, and its memory counters.

docs/design.md principle 1 and issue item 7: what the hardware cannot honour is resolved at
plan time. The executor therefore refuses a plan whose values this device would drop
silently (Trainer turns pin memory off under `use_cpu`; accelerate runs "fp16" on CPU
without autocast) instead of training something other than what the plan printed.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.train.arguments import uses_cpu
from gpuplan.plan.types import Plan

_REPLAN = 're-run `gpuplan plan` for this machine (hardware.gpu = "cpu" or "auto")'


def check_device(plan: Plan) -> str:
    """ "cpu" or "cuda" after checking the plan against this process; ApplyError otherwise."""
    import torch

    world = plan.world_size
    launched = world_size()
    if uses_cpu(plan):
        problems = []
        if plan.resolved.training.dataloader_pin_memory:
            problems.append("training.dataloader_pin_memory = true (pinned memory needs CUDA)")
        if plan.resolved.training.tf32:
            problems.append("training.tf32 = true (TF32 is an Ampere tensor-core mode)")
        if plan.resolved.training.fp16:
            problems.append("training.fp16 = true (accelerate runs fp16 on CPU without autocast)")
        if plan.resolved.model.attn_implementation == "flash_attention_2":
            problems.append('model.attn_implementation = "flash_attention_2" (a CUDA kernel)')
        if plan.resolved.distributed.strategy == "deepspeed":  # FSDP2 runs on CPU ranks over gloo; DeepSpeed needs CUDA
            problems.append("distributed.strategy = 'deepspeed' (DeepSpeed needs CUDA)")
        if problems:
            raise ApplyError(
                'the plan is for hardware "cpu" but holds values the CPU cannot honour: '
                + "; ".join(problems)
                + f'. The planner resolves these for "cpu": {_REPLAN}'
            )
        _check_world(plan, world, launched)
        return "cpu"
    if not torch.cuda.is_available():
        raise ApplyError(
            f"the plan is for {plan.hardware.name or 'a GPU'!r} but this process sees no CUDA device "
            f"(torch {torch.__version__}); run it on that GPU, or {_REPLAN}"
        )
    _check_world(plan, world, launched)
    if torch.cuda.device_count() < 1:
        raise ApplyError("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    return "cuda"


def _check_world(plan: Plan, world: int, launched: int) -> None:
    """The plan's process count (count x nodes; on "cpu", count processes) must be what torchrun started."""
    if launched != world:
        raise ApplyError(
            f"the plan is for {world} process(es) (hardware.count x hardware.nodes) but this process "
            f"was launched with WORLD_SIZE={launched}; run `gpuplan apply PLAN`, which starts torchrun "
            "with the right number of processes (apply/launch/torchrun.py)"
        )


def world_size() -> int:
    """Processes in this run as launched (torchrun's WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_memory(device: str) -> dict[str, Any]:
    """Measured peaks: CUDA allocator counters, or the process's peak RSS on CPU.

    `torch.cuda.max_memory_allocated` is what the plan's `allocated_peak_bytes`
    estimates; `max_memory_reserved` adds the caching allocator's reserve. On CPU
    ru_maxrss is the whole process (interpreter, libraries, data included): KiB on
    Linux, bytes on macOS (getrusage(2)).
    """
    if device == "cuda":
        import torch

        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_rss_bytes": int(rss if sys.platform == "darwin" else rss * 1024)}
