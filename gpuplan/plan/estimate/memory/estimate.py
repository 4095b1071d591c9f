"""Analytic memory estimate: the peak of one optimizer step on one device, part by part.

Pure and fast (the fit solver calls it hundreds of times per plan). The parts:
model states (memory/states.py; per GPU under DDP/FSDP/DeepSpeed, with the parameters
gathered in flight and the communication buckets, memory/sharding.py), activations and the loss path
(memory/activations.py), counts per model (memory/layout.py), and what the GPU
adds beyond tensors (memory/overhead.py).

The peak is the largest of these moments of a steady-state step (step >= 2: the
optimizer states are created lazily by the first step), the same moments the
fake-tensor trace finds its peak at:
  end of forward   weights + states + activations + AMP weight casts + loss path
  backward start   the same with the loss path at its largest (3 fp32 b*s*vocab)
  after the head   activations + the head's weight gradient
  backward, layer  inside a layer's backward: its activations (or, checkpointed,
                   the saved inputs + the layer recomputed) + the MLP's gradients
  optimizer step   weights + states + gradients + the step's temporaries
With gradient accumulation every micro-batch after the first runs with all
gradients alive (they persist until zero_grad), so they add to every moment.
"""

from __future__ import annotations

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.activations import ActivationParts, activation_parts, mode_of
from gpuplan.plan.estimate.memory.generation import with_generation
from gpuplan.plan.estimate.memory.layout import ModelLayout, model_layout
from gpuplan.plan.estimate.memory.loss_chunking import loss_tokens
from gpuplan.plan.estimate.memory.offload_activations import offloaded_bytes
from gpuplan.plan.estimate.memory.overhead import peak_moment
from gpuplan.plan.estimate.memory.preference import policy_workload, reference_bytes
from gpuplan.plan.estimate.memory.sharding import sharded_states
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES, optimizer_kind
from gpuplan.plan.estimate.memory.types import MemoryEstimate, Workload
from gpuplan.plan.estimate.memory.vision import pixel_input_bytes, with_tower
from gpuplan.plan.methods import method_of

__all__ = ["estimate_memory"]


def estimate_memory(facts: ModelFacts, workload: Workload, gpu: GPUProfile | None = None) -> MemoryEstimate:
    """Peak memory of one device for `workload` on the model `facts` describes; online RL adds its
    generation (memory/generation.py)."""
    return with_generation(facts, workload, _training_step(facts, workload, gpu), gpu)


def _training_step(facts: ModelFacts, workload: Workload, gpu: GPUProfile | None) -> MemoryEstimate:
    workload = policy_workload(workload)  # DPO: per_device_batch examples = 2x the sequences
    if method_of(workload.adapters).frozen_base:  # LoRA / QLoRA: a frozen base (memory/adapters.py)
        from gpuplan.plan.estimate.memory.adapters import estimate_adapter_memory

        return with_tower(estimate_adapter_memory(facts, workload, gpu), facts, workload, adapters=True)
    wl = workload
    notes: list[str] = []
    layout = model_layout(facts)
    kind = _optimizer_kind(wl, notes)
    # model states per GPU under wl.engine, and the unsharded parameters in flight
    # (memory/sharding.py); engine "none" is the single-device case
    st = sharded_states(facts, wl, layout, kind)
    notes.extend(st.notes)
    ref_gpu, ref_host = reference_bytes(facts, wl)  # a frozen reference copy (DPO, KTO), sharded as TRL shards it
    weights = st.weights + ref_gpu
    grads = st.grads_backward
    states = st.optimizer_states
    step_temp = st.step_temp

    parts = activation_parts(facts, wl)
    if parts.note:
        notes.append(parts.note)
    layers = facts.num_layers
    half = mode_of(wl) == "half"
    # autocast's fp32 -> 16-bit weight copies; sharded engines gather 16-bit params instead
    amp = wl.amp is not None and wl.weight_dtype == "float32" and st.autocast_casts
    head_grad, grads_at_first_layer = _backward_gradients(facts, layout, grads)
    acc = st.accumulated_grads
    buckets = st.buckets
    grad_logits = _logits_gradient(facts, wl, amp, half)
    saved, fwd_casts, bwd_casts, recompute = _saved_activations(facts, wl, layout, parts, amp, half)

    offloaded = 0
    if wl.offload_activations and not wl.gradient_checkpointing:
        # memory/offload_activations.py: one layer's saved tensors on the GPU at a time, the rest
        # (and the autocast copies backward keeps) in pinned host RAM
        offloaded = offloaded_bytes(parts.per_layer, layers, parts.outside_layers) + bwd_casts
        saved, bwd_casts = parts.per_layer, bwd_casts // max(layers, 1)

    def moment(gradients: int, activations: int, logits: int, temporaries: int = 0, gathered: int = 0) -> dict[str, int]:
        # gathered (unsharded) parameters count as weights, communication buckets as gradients
        return {
            "weights": weights + gathered,
            "gradients": gradients + buckets,
            "optimizer_states": states,
            "activations": activations,
            "logits_loss": logits,
            "temporaries": temporaries,
        }

    chunk_grad = _chunk_head_gradient(wl, layout, amp, half)
    moments = [
        moment(acc, saved + fwd_casts, parts.logits_fwd, pixel_input_bytes(facts, wl), gathered=st.gathered_forward),
        moment(acc, saved + bwd_casts, parts.logits_bwd_start, chunk_grad, gathered=st.gathered_forward),
        moment(acc or head_grad, saved + bwd_casts, grad_logits, gathered=st.gathered_head),
        moment(st.grads_step, 0, 0, step_temp),
    ]
    # inside a layer's backward, with its activations (or its recomputed ones) alive:
    # the last layer (j = 0, only the head's gradient exists yet) and the first layer
    # (j = L-1: the head's and L-1 layers' gradients; the embeddings' comes last).
    # Memory is linear in j in between, so the ends bound it.
    moments.append(moment(acc or head_grad, saved + bwd_casts + recompute, 0, parts.layer_backward, gathered=st.gathered_last_layer))
    if wl.gradient_checkpointing:
        first = parts.outside_layers + parts.per_layer_checkpointed + recompute
    elif offloaded:
        first = parts.per_layer + bwd_casts
    else:
        first = parts.outside_layers + parts.per_layer + bwd_casts // max(layers, 1)
    moments.append(moment(acc or grads_at_first_layer, first, 0, parts.layer_backward, gathered=st.gathered_first_layer))
    allocated, overhead, components = peak_moment(moments, wl.device, gpu)
    est = MemoryEstimate(
        allocated_peak_bytes=int(allocated),
        reserved_peak_bytes=int(allocated + overhead),
        components=components,
        method="analytic",
        notes=tuple(notes),
        host_bytes=int(st.host_bytes + offloaded + ref_host),
        host_pinned_bytes=int(st.host_pinned + offloaded + ref_host),  # offloaded activations sit in pinned host RAM
        offloaded_activation_bytes=int(offloaded),
    )
    return with_tower(est, facts, wl, adapters=False)  # a VLM's vision tower (memory/vision.py)


def _optimizer_kind(wl: Workload, notes: list[str]) -> str:
    """The optimizer's kind for `wl.optim`, noting what the estimate assumes about it."""
    kind, note = optimizer_kind(wl.optim)
    if note:
        notes.append(note)
    if wl.optim.startswith("paged_"):
        notes.append(
            "paged optimizer: states of tensors >= 1e5 elements live in CUDA managed memory; "
            "counted here although torch.cuda.max_memory_allocated does not show them"
        )
    return kind


def _backward_gradients(facts: ModelFacts, layout: ModelLayout, grads: int) -> tuple[int, int]:
    """The gradients alive in the last layer's backward (the head's) and in the first layer's."""
    layers = facts.num_layers
    n_params = facts.n_params
    # gradients fill in as backward runs: the head's first, then one layer's worth per layer
    layer_grads = grads * (layout.layer_params // max(layers, 1)) // max(n_params, 1)
    head_grad = grads * layout.head_params // max(n_params, 1)
    grads_at_first_layer = head_grad + (layers - 1) * layer_grads
    return head_grad, grads_at_first_layer


def _logits_gradient(facts: ModelFacts, wl: Workload, amp: bool, half: bool) -> int:
    """The gradient of the logits in the head's backward (0 where the loss never makes it)."""
    wb = DTYPE_BYTES[wl.weight_dtype]
    tokens = wl.per_device_batch * wl.seq_len
    # the head's backward: gradient of the logits in the model's compute dtype
    # one chunk with chunked cross-entropy; none after the head with Liger's fused loss (memory/liger.py)
    lt = 0 if wl.liger_kernel else loss_tokens(tokens, wl.loss_chunk_size)
    grad_logits = lt * facts.vocab_size * (2 if (amp or half or wb == 2) else 4) if wl.task != "seq-cls" else 0
    if wl.objective != "sft":
        grad_logits = 0  # TRL's fused head: in its backward (activations.py logits_bwd_start)
    return grad_logits


def _saved_activations(
    facts: ModelFacts, wl: Workload, layout: ModelLayout, parts: ActivationParts, amp: bool, half: bool
) -> tuple[int, int, int, int]:
    """What stays saved for backward: activations, autocast's weight copies (forward, backward), a recomputed layer."""
    layers = facts.num_layers
    tokens = wl.per_device_batch * wl.seq_len
    casts = 2 * layout.cast_params if amp else 0
    head_casts = 2 * layout.head_params if amp else 0
    if wl.gradient_checkpointing:
        saved = layers * parts.per_layer_checkpointed + parts.outside_layers
        # autocast's weight-cast cache lives until the forward leaves autocast; the
        # checkpointed layers keep none of them for backward, the head keeps its own
        fwd_casts, bwd_casts = casts, head_casts
        # the recomputed layer, when its MLP gradients peak: all its saved tensors but the
        # gated MLP's product (consumed by down_proj's backward; a plain MLP's activation
        # output is still held then) and its output (not kept: the
        # next layer saved its own input) (trace of a checkpointed layer, peak listing)
        act_b = 2 if (amp or half) else 4
        consumed = tokens * facts.intermediate_size * act_b if facts.mlp == "gated" else 0
        recompute = (
            parts.per_layer
            - consumed
            - tokens * facts.hidden_size * (2 if half else 4)
            + (2 * layout.cast_params // max(layers, 1) if amp else 0)
        )
    else:
        saved = layers * parts.per_layer + parts.outside_layers
        fwd_casts = bwd_casts = casts
        recompute = 0
    return saved, fwd_casts, bwd_casts, recompute


def _chunk_head_gradient(wl: Workload, layout: ModelLayout, amp: bool, half: bool) -> int:
    """The head weight gradient each chunk of chunked cross-entropy makes in its backward."""
    wb = DTYPE_BYTES[wl.weight_dtype]
    tokens = wl.per_device_batch * wl.seq_len
    # chunked cross-entropy: each chunk's backward makes its own head weight gradient (compute
    # dtype) beside the chunk's loss path before it is added to .grad (trace, tests/apply/test_chunked_loss.py)
    chunked = wl.loss_chunk_size and tokens > wl.loss_chunk_size and wl.task != "seq-cls"
    return layout.head_params * (2 if (amp or half or wb == 2) else 4) if chunked else 0
