"""Paged optimizers (bitsandbytes paged_adamw_8bit / paged_adamw_32bit / paged_lion_* ...): what
paging does and does not save at the peak.

bitsandbytes 0.50 optim/optimizer.py `get_state_buffer`: the states of every parameter of at
least 100,000 elements are allocated with `F.get_paged` (cudaMallocManaged, CUDA unified
memory); `prefetch_state` brings one parameter's states to the GPU just before its update in
`step`. When the GPU runs short, the driver evicts managed pages to host RAM instead of
failing (NVIDIA CUDA C++ Programming Guide, "Unified Memory: oversubscription"); that is what
QLoRA's paged optimizers are for (Dettmers et al. 2023, section 3: "to avoid the memory spikes
of gradient checkpointing"). On a CPU device paging is off (bitsandbytes falls back to plain
states with a warning).

So paging can give back at most the optimizer states (they are untouched during forward and
backward) and never any weight, gradient, activation or logit; the step needs each state back
on the GPU, over the host link, in every step that evicted it. gpuplan counts the states as
resident and does not rely on paging to fit. torch.cuda.max_memory_allocated does not count
managed memory, so a measured peak reads lower by the paged states.
"""

from __future__ import annotations

from gpuplan.units import gib


def is_paged(optim: str) -> bool:
    return optim.startswith("paged_")


PAGED_MIN_NUMEL = 100_000  # bitsandbytes get_state_buffer: smaller tensors keep ordinary states


def paged_bytes(shapes, state_bytes_per_value: int) -> int:
    """Optimizer-state bytes bitsandbytes puts in unified memory: tensors of >= 100,000 elements."""
    from math import prod

    return sum(prod(s) * state_bytes_per_value for s in shapes if prod(s) >= PAGED_MIN_NUMEL)


def paged_share(shapes) -> float:
    """The fraction of the trainable values whose states bitsandbytes pages (tensors >= 100,000)."""
    from math import prod

    total = sum(prod(s) for s in shapes)
    return sum(prod(s) for s in shapes if prod(s) >= PAGED_MIN_NUMEL) / total if total else 0.0


def page_in_seconds(state_bytes: int, host_link_gbps: float) -> float:
    """Seconds one step spends paging every state back in after an eviction (one direction
    over the host link, GB/s per direction in the catalog): the upper bound of paging's cost."""
    return state_bytes / (host_link_gbps * 1e9)


def paging_wording(optim: str, state_bytes: int, host_link_gbps: float | None, cpu: bool) -> str:
    """What paging does and does not save for this plan (the optimizer reason's tail)."""
    if cpu:
        return f"{optim} on a CPU device: bitsandbytes does not page there (plain states, with a warning); paging saves nothing"
    link = ""
    if host_link_gbps:
        link = (
            f"; a step that paged them out spends up to {page_in_seconds(state_bytes, host_link_gbps):.2g} s "
            f"bringing them back over the {host_link_gbps:g} GB/s host link"
        )
    return (
        f"{optim}: the optimizer states of tensors of >= 100,000 elements (at most {gib(state_bytes, 2)} here) "
        "live in CUDA unified memory, which the driver pages to host RAM when the GPU runs short, so a spike can "
        f"borrow at most those {gib(state_bytes, 2)}; weights, gradients, activations and the logits are not paged"
        + link
        + "; the plan counts the states as resident (torch.cuda.max_memory_allocated does not show them)"
    )
