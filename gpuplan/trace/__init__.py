"""Traced memory estimate: real training steps of the real model under FakeTensorMode.

`trace_memory` builds the transformers model from its config dict, then runs
`steps` optimizer steps as transformers.Trainer runs them (forward under autocast,
loss / accumulation, backward with the planned checkpointing, clip_grad_norm_, the
planned optimizer's step, zero_grad(set_to_none=True)) on fake tensors, counting
live storage bytes (gpuplan/trace/tracker.py). Nothing is allocated; no GPU needed.

Torch and transformers are imported inside the function: the plan path stays light.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, cast

from gpuplan.plan.estimate.memory.overhead import overhead_bytes
from gpuplan.plan.estimate.memory.types import COMPONENTS, MemoryEstimate, Workload
from gpuplan.plan.methods import method_of

__all__ = ["trace_memory"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def _unpacked_sequences(packed: bool = False):
    """Tell transformers' mask builder whether the batch holds packed sequences.

    masking_utils.find_packed_sequence_indices reads position_ids values to detect
    packing; on fake tensors it cannot, so it assumes packing and materializes a
    (b, 1, s, s) mask, which also turns off SDPA's is_causal path and GQA. A real
    run on ordinary (unpacked) batches gets None there: so do we. A packed workload
    (examples with restarting position ids, Workload.packed) gets the mask, as a real
    packed batch does (masking_utils.py sdpa_mask: packed_sequence_mask_function).
    """
    from transformers import masking_utils

    saved = masking_utils.find_packed_sequence_indices
    if not packed:
        masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = saved


def trace_memory(
    config: Mapping, workload: Workload, *, steps: int = 2, compute_capability: tuple[int, int] | None = None
) -> MemoryEstimate:
    """Peak memory of `steps` training steps of the model `config` describes (method="traced")."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpuplan.modelinfo.vision_families import VLM_FAMILIES

    wl = workload
    t0 = time.perf_counter()
    rss0 = _rss_bytes()
    notes: list[str] = []
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[wl.amp]
    from gpuplan.spec.objectives import objective

    obj = objective(wl.objective, wl.loss_type)
    ops, head_kernels, dequant = _kernel_contexts(wl, obj)
    # flash_attention_2 reads packed position ids as varlen boundaries (no mask): traced unpacked
    packed = wl.packed and wl.attn_implementation != "flash_attention_2"
    # a vision-language model's forward indexes by data (Idefics3 drops all-zero padding images,
    # Qwen2-VL's positions come from image_grid_thw): fake tensors cannot run it, so a VLM is traced
    # on real CPU tensors (a tiny config: the same storages, counted the same way)
    vlm = config.get("model_type") in VLM_FAMILIES
    fake: AbstractContextManager[Any] = nullcontext() if vlm else FakeTensorMode(allow_non_fake_inputs=True)
    if vlm:
        notes.append("vision-language model: traced on real CPU tensors (its forward indexes by data)")
    with _unpacked_sequences(packed), ops, head_kernels, dequant, fake:
        run = _set_up(config, wl, obj, notes)
        try:
            with run.tracker:
                _run_steps(run, wl, obj, amp_dtype, vlm, steps)
        finally:
            run.tracker.close()
    tracker = run.tracker
    allocated, components, overhead = _components(tracker, wl, compute_capability)
    wall = time.perf_counter() - t0
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    notes.append(f"peak at {tracker.peak_where}")
    notes.extend(_cuda_notes(wl, amp_dtype, packed))
    if wl.amp == "fp16":
        notes.append("fp16 GradScaler not traced: it scales in place (a few scalars)")
    notes.append(f"trace: {wall:.1f} s wall, host RSS +{(_rss_bytes() - rss0) / 2**20:.0f} MiB (process peak {rss_peak / 2**20:.0f} MiB)")
    return MemoryEstimate(
        allocated_peak_bytes=int(allocated),
        reserved_peak_bytes=int(allocated + overhead),
        components=components,
        method="traced",
        notes=tuple(notes),
    )


def _kernel_contexts(
    wl: Workload, obj: Any
) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any], AbstractContextManager[Any]]:
    """The contexts that pick the plan's kernels: the device's ops, the fused head's, DoRA's 4-bit dequant."""
    from gpuplan.trace.cuda_ops import cuda_like_ops

    # a CUDA plan traces CUDA's kernel choices; a CPU plan keeps the CPU ones
    ops: AbstractContextManager[Any] = cuda_like_ops() if wl.device == "cuda" else nullcontext()
    head_kernels: AbstractContextManager[Any]
    if obj.fused_head:
        from gpuplan.trace import preference

        head_kernels = preference.cuda_head_kernels(wl.device == "cuda")
    else:
        head_kernels = nullcontext()
    dequant: AbstractContextManager[Any] = nullcontext()
    if wl.adapters is not None and method_of(wl.adapters).quantized_base and wl.adapters.use_dora:
        from gpuplan.trace.adapters import fake_4bit_dequant

        dequant = fake_4bit_dequant()  # DoRA dequantizes the 4-bit base weight in every forward
    return ops, head_kernels, dequant


@dataclasses.dataclass
class _Run:
    """What the traced steps run: the model, its reference, its optimizer, the vocabulary, the tracker and the RL round held."""

    model: Any
    ref: Any
    optimizer: Any
    vocab: int
    tracker: Any
    rounds: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # TRL keeps a round's micro-batches until the next round


def _set_up(config: Mapping, wl: Workload, obj: Any, notes: list[str]) -> _Run:
    """The model (with the fused head and reference an objective needs), its optimizer and the tracker counting them."""
    from gpuplan.trace.build import build_model, optimizer_for
    from gpuplan.trace.tracker import StorageTracker

    model = build_model(config, wl)
    ref = None
    if obj.fused_head:
        from gpuplan.trace import preference

        if obj.is_rl:
            from gpuplan.trace import rl

            preference.add_head(model, rl.RL_HEAD_OUTPUTS)
        else:
            preference.add_head(model)
        ref = preference.build_reference(config, wl)
    cfg = model.config
    vocab = getattr(cast(Any, cfg).get_text_config(), "vocab_size", 0) or 0
    if note := getattr(model, "_gpuplan_note", None):  # build_model: eager in place of SDPA
        notes.append(note)
    optimizer, note = optimizer_for(model, wl, cuda=wl.device == "cuda")
    if note:
        notes.append(note)
    logits_dims: tuple[int, ...] = (vocab,) if wl.task != "seq-cls" else ()
    if obj.fused_head:  # the head's [4096, 32768] logits tiles (trl kernels/chunked_logprob.py)
        logits_dims += (32768,)
    tracker = StorageTracker(logits_last_dims=logits_dims)
    tracker.track_model(model)
    if obj.fused_head:
        tracker.track_fused_head(model, ref)
    return _Run(model, ref, optimizer, vocab, tracker)


def _run_steps(run: _Run, wl: Workload, obj: Any, amp_dtype: Any, vlm: bool, steps: int) -> None:
    """Runs `steps` optimizer steps of micro-batches (generation rounds, forward, backward), phase by phase."""
    from gpuplan.trace.build import make_batch, make_vlm_batch

    model, ref, optimizer, vocab, tracker = run.model, run.ref, run.optimizer, run.vocab, run.tracker
    used = 0
    for step in range(steps):
        tracker.step_index = step
        for _ in range(wl.gradient_accumulation_steps):
            if obj.is_rl and used == len(run.rounds):  # a generation round's tensors (trace/rl.py)
                from gpuplan.trace import rl

                tracker.phase = "generation"
                run.rounds, used = [], 0  # the last round's freed first, as TRL replaces its buffer
                run.rounds = rl.make_round(model, ref, wl, vocab, amp_dtype)
            if obj.is_preference or obj.is_rl:
                batch = None
            else:
                batch = make_vlm_batch(model, wl) if vlm else make_batch(wl, vocab)
            tracker.phase = "forward"
            tracker.in_head = False
            if obj.is_rl:
                from gpuplan.trace import rl

                loss = rl.rl_loss(model, run.rounds[used], amp_dtype)
                used += 1
            elif batch is None:
                from gpuplan.trace import preference

                loss = preference.preference_loss(model, ref, wl, vocab, amp_dtype)
            else:
                loss = _model_loss(model, batch, amp_dtype)
                del batch
            if wl.gradient_accumulation_steps > 1:
                loss = loss / wl.gradient_accumulation_steps  # Trainer.training_step
            tracker.phase = "backward"
            loss.backward()
            del loss
        _optimizer_step(model, optimizer, tracker)


def _model_loss(model: Any, batch: Any, amp_dtype: Any) -> Any:
    """The model's own loss on one batch (under CPU autocast when the plan trains in mixed precision)."""
    import torch

    if amp_dtype is not None:
        # CPU autocast; for a CUDA plan with CUDA's cast policy (cuda_autocast.py)
        with torch.autocast("cpu", dtype=amp_dtype):
            out = model(**batch)
    else:
        out = model(**batch)
    loss = out.loss
    del out
    return loss


def _optimizer_step(model: Any, optimizer: Any, tracker: Any) -> None:
    """The optimizer phase of a step: clip the gradients, step, count the optimizer's states, zero the gradients."""
    import torch

    tracker.phase = "optimizer"
    # Trainer default max_grad_norm=1.0
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    tracker.scan_optimizer(optimizer)
    optimizer.zero_grad(set_to_none=True)
    tracker.phase = "idle"


def _components(tracker: Any, wl: Workload, compute_capability: tuple[int, int] | None) -> tuple[Any, dict[str, int], int]:
    """The traced peak, its bytes per component (the rest in temporaries) and the allocator's overhead on it."""
    parts = tracker.peak_components()
    allocated = tracker.peak
    components = {k: int(parts.get(k, 0)) for k in COMPONENTS if k != "overhead"}
    # anything not in a named part (should be none) goes to temporaries
    components["temporaries"] += allocated - sum(components.values())
    overhead = overhead_bytes(allocated, wl.device, compute_capability)
    components["overhead"] = overhead
    return allocated, components, overhead


def _cuda_notes(wl: Workload, amp_dtype: Any, packed: bool) -> list[str]:
    """How a CUDA plan was traced on the CPU: fake tensors, CUDA's kernels, autocast ops gpuplan does not know."""
    import torch

    notes: list[str] = []
    if wl.device == "cuda":
        notes.append(
            "traced on fake CPU tensors (a CPU build of torch cannot run autograd on fake cuda "
            "tensors) under CUDA's autocast cast policy (trace/cuda_autocast.py); SDPA runs CUDA's "
            "flash / memory-efficient kernels' shape functions, dropout keeps a bool mask and AdamW "
            "runs foreach, as on CUDA (trace/cuda_ops.py); batches have no padding"
            + ("; packed examples: transformers' (b, 1, s, s) mask" if packed else ", no packed sequences")
        )
    if wl.device == "cuda" and amp_dtype is not None:
        from gpuplan.trace.cuda_autocast import unlisted_ops

        if unlisted := unlisted_ops():
            notes.append(
                f"torch {torch.__version__} autocasts {', '.join(unlisted)} on CUDA by a policy gpuplan "
                "does not know: traced with CPU autocast's"
            )
    return notes
