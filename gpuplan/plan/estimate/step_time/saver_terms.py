"""The memory savers' time costs as named step-time terms (Term), for plan/estimate/step_time/model.py
to combine with the rest. Pure.

- chunked cross-entropy (estimate/memory/loss_chunking.py): the output head's forward runs once
  more per chunk in backward: 2 x hidden x vocab FLOPs per token (2 FLOPs per weight per token,
  Kaplan et al. 2020, section 2.1), a GEMM of `chunk` rows at eta(chunk) of the dense peak
  (terms.gemm_efficiency); device work, per micro-batch.
- activation offloading (estimate/memory/offload_activations.py): every offloaded byte to host
  RAM in forward and back in backward over the catalog's host link; the copies are synchronous
  (copy_ into pinned memory, as torch.autograd.graph.save_on_cpu does), so nothing overlaps them:
  serial, per micro-batch. The catalog's PCIe figure is the link's rate per direction; pinned copies
  reach constants.HOST_COPY_FRACTION of it.
"""

from __future__ import annotations

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory import loss_chunking, offload_activations
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.terms import Term, gemm_efficiency


def chunked_loss_term(facts: ModelFacts, wl: Workload, gpu: GPUProfile, peak_flops: float) -> Term:
    m = wl.per_device_batch * wl.seq_len
    chunk = loss_chunking.loss_tokens(m, wl.loss_chunk_size)
    flops = loss_chunking.extra_flops_per_token(facts.hidden_size, facts.vocab_size) * m
    eta = gemm_efficiency(K.constants_for(gpu), chunk, facts.vocab_size)  # the head GEMM writes rows x vocab
    return Term(
        loss_chunking.NAME,
        "matmuls",
        flops / (eta * peak_flops),
        "micro-batch",
        "device",
        f"2 x {facts.hidden_size:,} x {facts.vocab_size:,} x m FLOPs (the head recomputed per chunk in "
        f"backward) at eta({chunk:,} rows) of the peak",
        "Kaplan et al. 2020; estimate/memory/loss_chunking.py",
    )


def offload_term(facts: ModelFacts, wl: Workload, gpu: GPUProfile) -> Term:
    from gpuplan.plan.estimate.memory.estimate import estimate_memory

    moved = estimate_memory(facts, wl, gpu).offloaded_activation_bytes
    link = float(gpu.interconnect["pcie"])
    return Term(
        offload_activations.NAME,
        "offload",
        offload_activations.transfer_seconds(moved, 1, link),
        "micro-batch",
        "serial",
        f"2 x {moved / 2**30:.1f} GiB of saved activations to pinned host RAM and back at {K.HOST_COPY_FRACTION:.0%} of {link:g} GB/s",
        f"torch.autograd.graph.saved_tensors_hooks; catalog pcie; {K.HOST_COPY_SOURCE}",
    )


def saver_terms(facts: ModelFacts, wl: Workload, gpu: GPUProfile, peak_flops: float) -> list[Term]:
    """The terms of the savers `wl` has on."""
    out = []
    if wl.loss_chunk_size and wl.task == "causal-lm" and not wl.liger_kernel:
        out.append(chunked_loss_term(facts, wl, gpu, peak_flops))
    if wl.offload_activations and not gpu.is_cpu and gpu.interconnect.get("pcie"):
        out.append(offload_term(facts, wl, gpu))
    return out
