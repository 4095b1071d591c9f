"""Activation offloading: the tensors autograd saves for backward kept in pinned host RAM.

apply/model/activation_offload.py runs the model's forward under torch.autograd.graph.saved_tensors_hooks
(the mechanism of torch.autograd.graph.save_on_cpu and of torchtune's OffloadActivations): each
saved tensor of at least 1 MiB that is not a parameter is copied to pinned host memory when
autograd saves it and copied back when backward needs it. The GPU then holds about one layer's
activations at a time (the layer computing in forward, the layer unpacked in backward), and the
host holds the rest.

Memory: activations at the peak = one layer's; host RAM per GPU = every layer's activations
and the tensors outside the layers (memory/activations.py ActivationParts). The loss path is
counted as without offloading (its tensors are unpacked at the start of backward, where its
peak is).

Time: each offloaded byte crosses the host link twice per micro-batch (out in forward, back in
backward). The copies are synchronous (copy_ into pinned memory, as save_on_cpu does), so the
time adds to the step: 2 x bytes x micro-batches / (host link GB/s per direction x 1e9 x HOST_COPY_FRACTION),
the catalog's `pcie` figure (hardware/catalog.toml, GB/s per direction) at the fraction pinned copies reach
(step_time/constants.py).

Where it cannot help: a CPU device (the activations are already in host RAM), and gradient
checkpointing (torch's checkpoint holds each layer's input itself; what is left to offload is
a few tensors outside the layers), so the fit search does not combine the two.
"""

from __future__ import annotations

from gpuplan.plan.estimate.step_time.constants import HOST_COPY_FRACTION

NAME = "activation offloading"
KEY = "training.activation_offloading"
MIN_BYTES = 1 << 20  # smaller saved tensors stay on the GPU (torchtune OffloadActivations' min_offload_size)


def offloaded_bytes(per_layer: int, layers: int, outside: int) -> int:
    """Bytes one micro-batch keeps in host RAM: every layer's saved tensors and those outside."""
    return per_layer * layers + outside


def transfer_seconds(offloaded: int, micro_batches: int, host_link_gbps: float) -> float:
    """Seconds per optimizer step the copies add: out and back, every micro-batch, at the fraction of the catalog's
    host link pinned copies reach (step_time/constants.py HOST_COPY_FRACTION)."""
    return 2 * offloaded * micro_batches / (host_link_gbps * 1e9 * HOST_COPY_FRACTION)


def unavailable(device: str, gradient_checkpointing: bool, host_link_gbps: float | None) -> str | None:
    if device == "cpu":
        return "on a CPU the activations already live in host RAM: offloading them cannot help"
    if gradient_checkpointing:
        return (
            "with gradient checkpointing each layer keeps only its input, which torch's checkpoint holds itself: "
            "offloading would move almost nothing"
        )
    if not host_link_gbps:
        return "the catalog has no host link (PCIe) bandwidth for this GPU: the copies cannot be priced"
    return None
