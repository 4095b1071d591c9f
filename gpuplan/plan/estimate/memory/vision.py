"""A vision-language model's vision tower in the step's memory: its activations per image.

The tower encodes every image of the micro-batch before the language model runs
(<F>Model.get_image_features in modeling_qwen2_vl.py, modeling_idefics3.py, ...): T =
batch x images per example x tower images (tiles) x tower tokens per image rows through
`num_layers` blocks of the tower's width. Its output features (one row per image placeholder, at
the language model's width) replace the placeholders' embeddings (masked_scatter).

- Frozen (the default): its weights do not require grad and neither do the pixels, so autograd
  records nothing in it: no tower activation survives its forward. The forward's live tensors
  peak inside one block, before the language model's activations exist; that is a moment of its
  own (weights + optimizer states + accumulated gradients + one block's tensors).
- Trained (vision.train_tower): each block keeps what its backward needs, for the whole step; with
  gradient checkpointing each block keeps its input and one block is recomputed in backward.

A block's bytes per row are the decoder-layer coefficients of memory/activations.py at the
tower's width, heads and MLP (a gated MLP and RMSNorm: the Llama block, Qwen2.5-VL; a plain MLP
and LayerNorm: the GPT-NeoX block, Qwen2-VL, CLIP, SigLIP): the same tensors per block (norm
inputs, q/k/v, attention output and log-sum-exp, the MLP's), not re-fitted against a traced tower.
Full fine-tuning with the tower frozen gives it neither gradients nor optimizer states: the
estimate's full-model states are scaled down by the tower's share of the parameters.

Qwen2-VL's tower differs from that block (modeling_qwen2_vl.py, transformers 5.24, counted with
saved-tensor hooks on the real tiny model and confirmed by tests/trace/test_vision_trace.py):
VisionAttention keeps the fused qkv output whole (v is a view of it) beside the rotated q and k
(apply_rotary_pos_emb_vision makes new tensors): 2h more per row than separate q/k/v; its MLP's
QuickGELU (x * sigmoid(1.702 x), activations.py QuickGELUActivation) keeps the sigmoid beside its
input: i more; the 2-D rope's cos and sin (fp32, rows x head_dim each) are kept once for all
blocks. Its PatchMerger (the projector) keeps, when it trains (a full fine-tune, or the tower
trained), ln_q's input and statistics, its output (mlp.0's input) and the GELU's input and output
(mlp.2's input): 4 x rows x width + 8 bytes a row.

Qwen2.5-VL's tower (modeling_qwen2_5_vl.py, transformers 5.25.0, counted the same way: the Llama
row at the tower's width matches a real LlamaDecoderLayer's saved tensors exactly, 6,680 B a row in
fp32 at width 64, and a Qwen2.5-VL block keeps 3h more): Qwen2_5_VLVisionAttention keeps the fused
qkv output whole beside the rotated q and k (2h, as Qwen2-VL), and its proj's input is a new tensor
(h): the non-flash path runs attention per window / image chunk and torch.cat's the outputs, where
the Llama layer's o_proj input shares the attention output's storage. Its gated SiLU MLP (with
bias), RMSNorms and the window_index reordering (hidden_states[window_index], int64 indices) keep
what the Llama row counts; windowed and full-attention blocks keep the same bytes (the per-window
outputs and log-sum-exps add up to the full one's). The 2-D rope's cos and sin are kept once, as
in Qwen2-VL. Its PatchMerger's ln_q is an RMSNorm: it keeps its input, 1 / rms (4 B a row) and the
normalized rows beside its output, then the GELU's input and output: 5 x rows x width + 4 bytes a
row when it trains (counted in fp32, where the trace runs; not checked in 16-bit).

Llama 3.2 Vision's tower (modeling_mllama.py, transformers 5.25, counted with saved-tensor hooks on
the real tiny model and confirmed by tests/trace/test_vision_trace.py) has no checkpointed blocks
(MllamaVisionEncoderLayer is a plain nn.Module), and gradient checkpointing records a frozen tower
anyway: activation_checkpointing_enable (modeling_utils.py) calls enable_input_require_grads, which
hooks every sub-model's input embeddings, the tower's patch_embedding included, so the blocks run
with autograd and keep all but their linear layers' inputs. Recorded, the tower also keeps its
(images, 1, tiles x padded rows, tiles x padded rows) attention mask once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.activations import activation_parts, mode_of
from gpuplan.plan.estimate.memory.types import MemoryEstimate, Workload
from gpuplan.units import gib


@dataclass(frozen=True)
class TowerMemory:
    rows: int  # tokens through the tower per micro-batch
    per_image: int  # bytes one image's rows take through the whole tower when trained (saved), or one block (frozen)
    saved: int  # kept for backward across the step (frozen: the checkpointed blocks' inputs only)
    transient: int  # one block's live tensors in the tower's forward
    features: int  # the tower's output at the language model's width, per micro-batch
    projector: int = 0  # of saved, what the projector keeps when it trains (Qwen2-VL's merger)


def _block_facts(facts: ModelFacts) -> ModelFacts:
    """The tower's block as a decoder layer of its width (for memory/activations.py)."""
    v = facts.vision
    assert v is not None
    gated = v.mlp == "gated"
    heads = max(v.num_attention_heads, 1)
    return dataclasses.replace(
        facts,
        model_type="llama" if gated else "gpt_neox",
        task="seq-cls",
        hidden_size=v.hidden_size,
        num_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=v.hidden_size // heads,
        intermediate_size=v.intermediate_size,
        mlp=v.mlp,
        norm="rmsnorm" if gated else "layernorm",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_experts=0,
        vision=None,
        param_shapes=(),
        linear_layers=(),
    )


def _qwen_vl_extras(facts: ModelFacts, wl: Workload, rows: int, elt: int) -> tuple[int, int, int]:
    """Qwen2-VL's and Qwen2.5-VL's towers beyond the decoder row (see the module docstring): bytes per
    row per block, the rope tables kept once, the merger's saved bytes when it trains (0 otherwise)."""
    v = facts.vision
    assert v is not None
    if v.family == "qwen2_vl":
        # fused qkv kept whole beside the rotated q and k (2h), QuickGELU's sigmoid (i); merger: LayerNorm
        per_row, merger_row = (2 * v.hidden_size + v.intermediate_size) * elt, 4 * v.hidden_size * elt + 8
    elif v.family == "qwen2_5_vl":
        # fused qkv kept whole beside the rotated q and k (2h), proj's input a copy (torch.cat) of the
        # attention output (h); merger: RMSNorm ln_q
        per_row, merger_row = 3 * v.hidden_size * elt, 5 * v.hidden_size * elt + 4
    else:
        return 0, 0, 0
    rope = rows * (v.hidden_size // max(v.num_attention_heads, 1)) * 2 * 4
    merger_trains = wl.adapters is None or wl.train_tower
    merger = rows * merger_row if merger_trains else 0
    return per_row, rope, merger


def tower_memory(facts: ModelFacts, wl: Workload) -> TowerMemory | None:
    v = facts.vision
    if v is None or not wl.images_per_example or not wl.tower_tokens:
        return None
    images = wl.per_device_batch * wl.images_per_example * max(wl.tower_images, 1)
    rows = images * wl.tower_tokens
    block = _block_facts(facts)
    one = dataclasses.replace(wl, per_device_batch=1, seq_len=wl.tower_tokens, packed=False, adapters=None, liger_kernel=False)
    parts = activation_parts(block, one)
    act_b = 2 if mode_of(wl) != "fp32" else 4
    extra_row, rope, merger = _qwen_vl_extras(facts, wl, rows, act_b)
    per_row_block = parts.per_layer // max(wl.tower_tokens, 1) + extra_row
    features = wl.per_device_batch * wl.images_per_example * wl.image_tokens * facts.hidden_size * act_b
    transient = rows * per_row_block
    # checkpointed blocks (GradientCheckpointingLayer, torch.utils.checkpoint non-reentrant) keep each
    # block's input for the step, frozen or not (measured: the traced gap grows by rows x width x 4 B per
    # block of a frozen Idefics3 tower under checkpointing, tests/trace/test_vision_trace.py)
    inputs = v.num_layers * rows * v.hidden_size * (2 if mode_of(wl) == "half" else 4)
    # mllama's tower blocks (MllamaVisionEncoderLayer, modeling_mllama.py, transformers 5.25) are plain
    # nn.Modules, not GradientCheckpointingLayer: checkpointing leaves them keeping all they save; and
    # activation_checkpointing_enable (modeling_utils.py) calls enable_input_require_grads, which hooks
    # every sub-model's get_input_embeddings, MllamaVisionModel's patch_embedding included: its output
    # requires grad, so a frozen tower's blocks record autograd and keep as much as trained ones
    checkpointed = wl.gradient_checkpointing and v.family != "mllama"
    recorded = wl.train_tower or (wl.gradient_checkpointing and v.family == "mllama")
    if not recorded:
        kept = (inputs if checkpointed else 0) + merger
        return TowerMemory(rows, wl.tower_tokens * max(wl.tower_images, 1) * per_row_block, kept, transient, features, merger)
    # trained, the patch embedding keeps its input (the pixels, one patch x patch x 3 (x temporal) vector
    # per row, in the weights' dtype: <F>VisionEmbeddings casts pixel_values to it) for its weight
    # gradient, and the final norm its input (rows x width, fp32 statistics)
    channels = 3 * dict(v.geometry).get("temporal_patch_size", 1)
    pixels = rows * v.patch_size * v.patch_size * channels * (2 if wl.weight_dtype != "float32" else 4) if wl.train_tower else 0
    # Qwen2-VL has no final norm in the tower: the merger's ln_q (in `merger`) is it
    post = rows * v.hidden_size * 4 if not merger else merger + rope
    mask = 0
    if v.family == "mllama":
        # the tower's (images, 1, tiles x padded, tiles x padded) attention mask in the weights' dtype
        # (_prepare_aspect_ratio_attention_mask; each tile's rows padded to a multiple of 8), kept once by
        # the blocks' SDPA; a frozen tower recorded only by the hook (not trained) keeps no linear layer's
        # input (no weight gradient): the decoder row less its two norm outputs and the GELU's output.
        # Counted with saved-tensor hooks on the real tiny model (tests/trace/test_vision_trace.py)
        tiles, padded = max(wl.tower_images, 1), -(-wl.tower_tokens // 8) * 8
        mask = wl.per_device_batch * wl.images_per_example * (tiles * padded) ** 2 * (2 if wl.weight_dtype != "float32" else 4)
        if not wl.train_tower:
            per_row_block -= (2 * v.hidden_size + v.intermediate_size) * act_b
    if checkpointed:
        saved = inputs + pixels + post
    else:
        saved = v.num_layers * rows * per_row_block + pixels + post + mask
    # frozen (recorded by the hook), the note's per-image figure stays one block's, as when not recorded
    per_image = (
        saved // max(wl.per_device_batch * wl.images_per_example, 1)
        if wl.train_tower
        else wl.tower_tokens * max(wl.tower_images, 1) * (transient // max(rows, 1))
    )
    return TowerMemory(rows, per_image, saved, transient, features, merger)


def cross_attention_bytes(facts: ModelFacts, wl: Workload, projector_trains: bool, language_model_trains: bool) -> int:
    """Llama 3.2 Vision (mllama): the image is not in the language model's sequence (one <|image|>
    token); its cross-attention layers (MllamaCrossAttentionDecoderLayer, modeling_mllama.py,
    transformers 5.24) attend from the text to the projected tower output, images x tiles x
    (tile / patch)^2 + 1 rows an example. Kept for backward, counted with saved-tensor hooks on the
    real tiny model and checked by tests/trace/test_vision_trace.py:
    - per vision row and cross layer: k and v repeated to all heads (sdpa_attention_forward runs
      repeat_kv when a mask is given), k_norm's input and its x * rsqrt (fp32: 4 + 4 bytes; half:
      x.float() 4 + its 16-bit result 2) per kv element and its rsqrt per kv head;
    - once: the cross-attention states (k_proj / v_proj's input), the (b, 1, s, rows) additive
      cross-attention mask (_prepare_cross_attention_mask, in the weights' dtype), and when the
      projector trains its input (vision_output_dim wide);
    - per text token and cross layer, against the Llama layer the text side is priced with: the two
      tanh-gated residual branches keep their inputs (2h), q_norm as k_norm over the queries, and no
      k / v of the text (the Llama row's repeated k and v, or k and v).
    With the language model frozen under adapters (LoRA on its linear layers), the norms' weights and
    the two gates do not require grad: q_norm and k_norm keep only their fp32 input and rsqrt (not the
    normalized rows the weight's gradient would need), and the gated branches keep nothing (their
    inputs serve only the gates' gradients). Measured with saved-tensor hooks on the real tiny model:
    q_norm 528 -> 272 KiB, k_norm 268 -> 138 KiB, the gates 514 KiB -> 0 over its two cross layers.
    With gradient checkpointing (the cross layers are GradientCheckpointingLayer, non-reentrant) a
    layer keeps only its inputs: hidden_states, counted with the text layers, and the
    cross-attention states, mask and full_text_row_masked_out_mask shared by all layers (the `once`
    terms; the last is b x s floats); its own tensors are recomputed in backward. Measured: 0.993
    (tower frozen) and 0.983 (trained) of the traced peak."""
    v = facts.vision
    if v is None or v.family != "mllama" or not wl.images_per_example:
        return 0
    geo = dict(v.geometry)
    layers, out_dim = int(geo["cross_attention_layers"]), int(geo["vision_output_dim"])
    mode = mode_of(wl)
    elt = 4 if mode == "fp32" else 2
    w = 4 if wl.weight_dtype == "float32" else 2
    h, a, kv, d = facts.hidden_size, facts.num_attention_heads, facts.num_key_value_heads, facts.head_dim
    b, s = wl.per_device_batch, wl.seq_len
    rows = b * wl.images_per_example * max(wl.tower_images, 1) * wl.tower_tokens
    # per normed element: its fp32 input (x.float(), kept for rsqrt's backward) and, when the norm's weight
    # trains, the normalized rows its gradient needs (fp32 4 B; half: the 16-bit result, 2 B)
    norm = (8 if mode == "fp32" else 6) if language_model_trains else 4
    per_row = 2 * a * d * elt + kv * d * norm + kv * 4
    once = rows * h * elt + b * s * (rows // max(b, 1)) * w + (rows * out_dim * elt if projector_trains else 0)
    if wl.gradient_checkpointing:
        return once
    text_kv = 2 * a * d * 4 if mode == "fp32" else 2 * kv * d * 2
    gates = 2 * h * elt if language_model_trains else 0
    per_token = gates + a * d * norm + a * 4 - text_kv
    return layers * (rows * per_row + b * s * per_token) + once


def pixel_input_bytes(facts: ModelFacts, wl: Workload) -> int:
    """The micro-batch's pixel_values, alive until the end of the forward (Trainer.training_step
    deletes its inputs after compute_loss, before backward): the processors return fp32 pixels, one
    patch x patch x 3 (x temporal) vector per tower row (Qwen2-VL flattens them so; a tile of the
    other families holds the same values), cast to the tower's dtype inside the forward. Measured: a
    tiny Qwen2-VL's traced peak is at the end of its forward, with these 4.8 MB beside the logits
    (tests/trace/test_vision_trace.py); in a real model the logits' backward moment is larger."""
    v = facts.vision
    if v is None or not wl.images_per_example or not wl.tower_tokens:
        return 0
    if wl.train_tower and wl.weight_dtype == "float32":
        return 0  # the cast to fp32 is a no-op: the patch embedding's saved input (tower_memory's pixels) is this tensor
    rows = wl.per_device_batch * wl.images_per_example * max(wl.tower_images, 1) * wl.tower_tokens
    return rows * v.patch_size * v.patch_size * 3 * dict(v.geometry).get("temporal_patch_size", 1) * 4


def with_tower(est: MemoryEstimate, facts: ModelFacts, wl: Workload, adapters: bool) -> MemoryEstimate:
    """`est` (the language model's step) with the vision tower's memory."""
    t = tower_memory(facts, wl)
    if t is None:
        return est
    v = facts.vision
    assert v is not None
    c = dict(est.components)
    notes = list(est.notes)
    if not adapters and not wl.train_tower:
        share = (v.tower_params) / max(facts.n_params, 1)
        for k in ("gradients", "optimizer_states"):
            c[k] = int(c[k] * (1 - share))
    cross = cross_attention_bytes(facts, wl, projector_trains=not adapters or wl.train_tower, language_model_trains=not adapters)
    c["activations"] += t.features + (t.saved + cross if c["activations"] else 0)
    # the tower's own forward: before the language model's activations exist
    tower_moment = c["weights"] + c["optimizer_states"] + (c["gradients"] if wl.gradient_accumulation_steps > 1 else 0) + t.transient
    allocated = sum(v2 for k, v2 in c.items() if k != "overhead")
    if tower_moment > allocated:
        c = {k: 0 for k in c} | {
            "weights": c["weights"],
            "optimizer_states": c["optimizer_states"],
            "gradients": c["gradients"] if wl.gradient_accumulation_steps > 1 else 0,
            "activations": t.transient,
            "overhead": c["overhead"],
        }
        allocated = tower_moment
    if wl.train_tower:
        notes.append(
            f"vision tower trained: {t.rows:,} rows through {v.num_layers} blocks of width {v.hidden_size} per micro-batch keep "
            f"{gib(t.saved)} for backward ({gib(t.per_image)} per image"
            + (
                ", its blocks are not checkpointed"
                if wl.gradient_checkpointing and v.family == "mllama"
                else ", checkpointed: each block's input"
                if wl.gradient_checkpointing
                else ""
            )
            + ")"
        )
    else:
        blocks = t.saved - t.projector
        if wl.gradient_checkpointing and v.family == "mllama":
            kept = f"checkpointing makes its patch embedding's output require grad, so its blocks (not checkpointed) keep {gib(blocks)}"
        else:
            kept = f"checkpointing keeps each block's input ({gib(blocks)})" if blocks else "nothing kept for backward"
        if t.projector:
            kept += f", the trained projector keeps {gib(t.projector)}"
        notes.append(
            f"vision tower frozen: {t.rows:,} rows through {v.num_layers} blocks of width {v.hidden_size} per micro-batch, "
            f"{kept}; its forward holds {gib(t.transient)} in one block ({gib(t.per_image)} per image) "
            f"before the language model runs; its features at the language model's width: {t.features / 2**20:,.0f} MiB"
        )
    if cross:
        notes.append(
            f"cross-attention: the image is not in the text sequence (one <|image|> token); "
            f"{int(dict(v.geometry)['cross_attention_layers'])} cross-attention layers attend to {t.rows:,} projected tower rows "
            f"per micro-batch and keep {gib(cross)} for backward"
            + (" (checkpointed: the layers' shared inputs, each layer's own recomputed in backward)" if wl.gradient_checkpointing else "")
        )
    overhead = est.reserved_peak_bytes - est.allocated_peak_bytes
    return dataclasses.replace(
        est,
        allocated_peak_bytes=int(allocated),
        reserved_peak_bytes=int(allocated + overhead),
        components=c,
        notes=tuple(notes),
    )
