"""Analytic memory estimate: the peak of one optimizer step on one device, part by part.

Pure and fast (the fit solver calls it hundreds of times per plan). The parts:
model states (memory_states.py), activations and the loss path
(memory_activations.py), counts per model (memory_layout.py), and what the GPU
adds beyond tensors (memory_overhead.py).

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
from gpuplan.plan.memory_activations import activation_parts
from gpuplan.plan.memory_layout import model_layout
from gpuplan.plan.memory_overhead import overhead_bytes
from gpuplan.plan.memory_states import (
    DTYPE_BYTES,
    optimizer_kind,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
)
from gpuplan.plan.memory_types import COMPONENTS, MemoryEstimate, Workload

__all__ = ["estimate_memory"]


def estimate_memory(facts: ModelFacts, workload: Workload, gpu: GPUProfile | None = None) -> MemoryEstimate:
    """Peak memory of one device for `workload` on the model `facts` describes."""
    wl = workload
    notes: list[str] = []
    wb = DTYPE_BYTES[wl.weight_dtype]
    layout = model_layout(facts)
    n_params = facts.n_params
    kind, note = optimizer_kind(wl.optim)
    if note:
        notes.append(note)
    if wl.optim.startswith("paged_"):
        notes.append("paged optimizer: states of tensors >= 1e5 elements live in CUDA managed memory; "
                     "counted here although torch.cuda.max_memory_allocated does not show them")
    weights = wb * n_params
    grads = wb * n_params
    states = optimizer_state_bytes(kind, n_params, layout.n_tensors, facts.param_shapes, wb)
    step_temp = optimizer_step_temp_bytes(kind, n_params, layout.largest_tensor, wb)

    parts = activation_parts(facts, wl)
    if parts.note:
        notes.append(parts.note)
    layers = facts.num_layers
    amp = wl.amp is not None and wl.weight_dtype == "float32"
    casts = 2 * layout.cast_params if amp else 0
    head_casts = 2 * layout.head_params if amp else 0
    layer_grads = wb * layout.layer_params // max(layers, 1)
    head_grad = wb * layout.head_params
    acc = grads if wl.gradient_accumulation_steps > 1 else 0
    tokens = wl.per_device_batch * wl.seq_len
    # the head's backward: gradient of the logits in the model's compute dtype
    grad_logits = tokens * facts.vocab_size * (2 if (amp or wb == 2) else 4) if wl.task != "seq-cls" else 0

    if wl.gradient_checkpointing:
        saved = layers * parts.per_layer_checkpointed + parts.outside_layers
        # autocast's weight-cast cache lives until the forward leaves autocast; the
        # checkpointed layers keep none of them for backward, the head keeps its own
        fwd_casts, bwd_casts = casts, head_casts
        # the recomputed layer, when its MLP gradients peak: all its saved tensors but the
        # gated MLP's product (consumed by down_proj's backward; a plain MLP's activation
        # output is still held then) and its output (not kept: the
        # next layer saved its own input) (trace of a checkpointed layer, peak listing)
        act_b = 2 if (amp or wb == 2) else 4
        consumed = tokens * facts.intermediate_size * act_b if facts.mlp == "gated" else 0
        recompute = (parts.per_layer - consumed
                     - tokens * facts.hidden_size * (4 if wb == 4 else 2)
                     + (2 * layout.cast_params // max(layers, 1) if amp else 0))
    else:
        saved = layers * parts.per_layer + parts.outside_layers
        fwd_casts = bwd_casts = casts
        recompute = 0

    def moment(gradients: int, activations: int, logits: int, temporaries: int = 0) -> dict[str, int]:
        return {"weights": weights, "gradients": gradients, "optimizer_states": states,
                "activations": activations, "logits_loss": logits, "temporaries": temporaries}

    moments = [
        moment(acc, saved + fwd_casts, parts.logits_fwd),
        moment(acc, saved + bwd_casts, parts.logits_bwd_start),
        moment(acc or head_grad, saved + bwd_casts, grad_logits),
        moment(grads, 0, 0, step_temp),
    ]
    # inside a layer's backward, with its activations (or its recomputed ones) alive:
    # the last layer (j = 0, only the head's gradient exists yet) and the first layer
    # (j = L-1: the head's and L-1 layers' gradients; the embeddings' comes last).
    # Memory is linear in j in between, so the ends bound it.
    grads_at_first_layer = head_grad + (layers - 1) * layer_grads
    moments.append(moment(acc or head_grad, saved + bwd_casts + recompute, 0, parts.layer_backward))
    if wl.gradient_checkpointing:
        first = parts.outside_layers + parts.per_layer_checkpointed + recompute
    else:
        first = parts.outside_layers + parts.per_layer + bwd_casts // max(layers, 1)
    moments.append(moment(acc or grads_at_first_layer, first, 0, parts.layer_backward))
    peak = max(moments, key=lambda c: sum(c.values()))
    allocated = sum(peak.values())
    cc = gpu.compute_capability if gpu is not None else None
    overhead = overhead_bytes(allocated, wl.device, cc)
    components = {k: int(peak.get(k, 0)) for k in COMPONENTS if k != "overhead"}
    components["overhead"] = overhead
    return MemoryEstimate(
        allocated_peak_bytes=int(allocated),
        reserved_peak_bytes=int(allocated + overhead),
        components=components,
        method="analytic",
        notes=tuple(notes),
    )
