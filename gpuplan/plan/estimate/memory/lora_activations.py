"""Activations of one LoRA / QLoRA layer: the frozen layer, plus what each adapter keeps.

Per layer and per token (bytes), counted from peft 0.21's LoRA forward (tuners/lora/layer.py
Linear.forward, variants.py DoraLinearVariant, dora.py DoraLinearLayer) and fitted exactly
against the trace (benchmarks/lora_coefficients.py: integer coefficients, zero residual over
widths, sequence lengths, ranks and target subsets):

    c_h*h + c_q*(a*d) + c_kv*(kv*d) + c_i*i + c_a*a + c_1     the frozen layer with gradients flowing
    + c_in * (the adapters' inputs)                         lora_A keeps its input
    + c_r * r * (targets)                                   lora_B keeps lora_A's output
    + 1 * (the adapters' inputs), lora_dropout > 0          CUDA's dropout keeps a bool mask

"The adapters' inputs" is the sum of the targets' in_features: every target keeps a copy of
its own when its input is cast (peft's _cast_input_dtype to the fp32 adapter dtype on 16-bit
weights; autocast's per-op cast of a linear's input), but targets reading the same fp32 tensor
with no cast (modes fp32) share it: q/k/v (and gate/up) read one norm output, and the
attention projection's input is the attention output SDPA keeps anyway (_KEPT_INPUT).

DoRA (use_dora), per target, from DoraLinearLayer.forward: (mag_norm_scale - 1) * base_result
keeps the base layer's output and mag_norm_scale * lora_result keeps lora_B's: c_out bytes per
token per out_feature (the two dtypes); weight_norm, mag_norm_scale - 1 and mag_norm_scale are
kept in fp32 (12 bytes per out_feature per layer). With lora_dropout > 0 the base output is
recomputed as F.linear(dropout(x), weight), which keeps that weight for the input gradient:
a fresh copy whenever the weight is cast (autocast's per-op cast, 2 bytes per value; the
dequantized 4-bit weight moved to the fp32 input, 4) and the parameter itself otherwise (0).
The eye(in_features) lora weight DoRA builds each forward (get_lora_weight) only feeds the
detached weight norm: its graph dies with it, a transient of one layer.
"""

from __future__ import annotations

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.modelinfo.lora_targets import peft_matches
from gpuplan.plan.estimate.memory.types import Workload

# Targets that read the same tensor (no cast between them) in each block style
SHARED_INPUT = {
    "llama": ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}),
    "gemma": ({"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}),
    "opt": ({"q_proj", "k_proj", "v_proj"},),
    "bert": ({"query", "key", "value"},),
    "phi": ({"q_proj", "k_proj", "v_proj", "fc1"},),  # parallel block: one LayerNorm output
}
# linears that read the attention output (a 16-bit tensor under autocast)
ATTENTION_OUTPUT = frozenset({"o_proj", "out_proj", "dense", "c_proj"})
# uncast inputs the frozen layer keeps anyway: SDPA's kernels save their output, which the
# attention projection reads back as it is (transpose(1, 2).contiguous() of the kernel's
# (b, s, a, d) output is a no-op); OPT's ReLU saves its output, fc2's input
_KEPT_INPUT = {"opt": frozenset({"fc2"})}

# (style, mode, method) -> (c_h, c_q, c_kv, c_i, c_a, c_1, c_in), from
# `python benchmarks/lora_coefficients.py all`. Modes: fp32 | amp (fp32 weights, autocast) |
# half (16-bit weights) | half-amp (16-bit weights under autocast, the common LoRA setup)
ROWS: dict[tuple[str, str, str], tuple[int, int, int, int, int, int, int]] = {
    # derived from the all-linear / attention rows fitted before (each pair is one frozen layer
    # plus its targets' inputs: the two agree for every style and mode), then re-fitted
    ("llama", "fp32", "lora"): (8, 16, 0, 12, 4, 8, 4),
    ("llama", "amp", "lora"): (8, 4, 4, 6, 4, 8, 2),
    ("llama", "half", "lora"): (8, 4, 4, 6, 4, 8, 4),
    ("llama", "amp", "qlora"): (8, 4, 4, 12, 4, 8, 2),
    ("llama", "fp32", "qlora"): (8, 16, 0, 12, 4, 8, 4),
    ("gemma", "amp", "lora"): (8, 4, 4, 6, 4, 2, 2),
    ("gemma", "half", "lora"): (8, 4, 4, 6, 4, 2, 4),
    ("gemma", "amp", "qlora"): (8, 4, 4, 12, 4, 2, 2),
    ("gpt2", "fp32", "lora"): (26, 0, 0, 16, 4, 16, 4),
    ("gpt2", "amp", "lora"): (18, 0, 0, 14, 4, 16, 2),  # re-fitted under CUDA autocast (gelu_new's pow fp32)
    ("gpt2", "half", "lora"): (14, 0, 0, 8, 4, 8, 4),
    ("gpt2", "amp", "qlora"): (18, 0, 0, 16, 4, 6, 2),
    ("gpt2", "fp32", "qlora"): (26, 0, 0, 16, 4, 6, 4),
    ("gpt_neox", "fp32", "lora"): (28, 0, 0, 4, 4, 16, 4),
    ("gpt_neox", "amp", "lora"): (16, 0, 0, 2, 4, 16, 2),
    ("gpt_neox", "half", "lora"): (14, 0, 0, 2, 4, 8, 4),
    ("gpt_neox", "amp", "qlora"): (12, 0, 0, 4, 4, 6, 2),
    ("gpt_neox", "fp32", "qlora"): (28, 0, 0, 4, 4, 6, 4),
    ("opt", "fp32", "lora"): (26, 0, 0, 4, 4, 16, 4),
    ("opt", "amp", "lora"): (18, 0, 0, 2, 4, 16, 2),
    ("opt", "half", "lora"): (14, 0, 0, 2, 4, 8, 4),
    ("opt", "amp", "qlora"): (18, 0, 0, 4, 4, 6, 2),
    ("opt", "fp32", "qlora"): (26, 0, 0, 4, 4, 6, 4),
    ("bert", "amp", "lora"): (18, 0, 0, 2, 4, 16, 2),
    ("bert", "half", "lora"): (14, 0, 0, 2, 4, 8, 4),
    ("bert", "amp", "qlora"): (18, 0, 0, 4, 4, 6, 2),
    ("phi", "amp", "lora"): (12, 0, 0, 14, 4, 8, 2),  # re-fitted under CUDA autocast (gelu_new's pow fp32)
    ("phi", "half", "lora"): (10, 0, 0, 8, 4, 4, 4),
    ("phi", "amp", "qlora"): (12, 0, 0, 16, 4, -2, 2),
    # fitted
    ("gemma", "fp32", "lora"): (8, 16, 0, 12, 4, 2, 4),
    ("gemma", "fp32", "qlora"): (8, 16, 0, 12, 4, 2, 4),
    ("phi", "fp32", "lora"): (20, 0, 0, 16, 4, 8, 4),
    ("phi", "fp32", "qlora"): (20, 0, 0, 16, 4, -2, 4),
    # half-amp, fitted (residual under 300 bytes per layer; gpt_neox 2.5 kB)
    ("llama", "half-amp", "lora"): (8, 4, 4, 6, 4, 8, 2),
    ("gemma", "half-amp", "lora"): (8, 4, 4, 6, 4, 2, 2),
    ("gpt2", "half-amp", "lora"): (18, 0, 0, 14, 4, 4, 2),
    ("gpt_neox", "half-amp", "lora"): (20, 0, 0, 2, 4, -1, 2),
    ("bert", "half-amp", "lora"): (18, 0, 0, 2, 4, 4, 2),
    ("opt", "half-amp", "lora"): (18, 0, 0, 2, 4, 4, 2),
    ("phi", "half-amp", "lora"): (12, 0, 0, 14, 4, 2, 2),
}
# (mode, method) -> (c_out; c_out of a target reading the attention output; c_out and c_w with
# lora_dropout, where the base output is F.linear's, in autocast's dtype under autocast).
# Measured: benchmarks/lora_coefficients.py's trace, DoRA minus LoRA, 1 vs 2 layers, 64 vs 128 tokens.
_DORA = {
    ("fp32", "lora"): (8, 8, 8, 0),
    ("amp", "lora"): (4, 4, 4, 2),
    ("half", "lora"): (6, 6, 8, 4),
    ("half-amp", "lora"): (4, 4, 4, 2),
    # bitsandbytes Linear4bit returns its input's dtype: fp32 beside the 16-bit lora_B output,
    # except where the input is the 16-bit attention output
    ("amp", "qlora"): (6, 4, 4, 2),
    ("fp32", "qlora"): (8, 8, 8, 4),
}


_ATTENTION_INPUT = frozenset({"q_proj", "k_proj", "v_proj", "c_attn", "query_key_value", "query", "key", "value", "qkv_proj", "Wqkv"})
_MLP_INPUT = frozenset({"gate_proj", "up_proj", "gate_up_proj", "fc1", "c_fc", "dense_h_to_4h", "w1", "w3"})
_PARALLEL = frozenset({"phi", "gpt_neox"})  # attention and MLP both read the layer input


def first_layer_saving(style: str, row: tuple, facts: ModelFacts, targets: list[tuple[str, int, int]]) -> int:
    """Bytes per token the first layer does not keep: without checkpointing nothing upstream of
    its first adapter needs a gradient (frozen embeddings, no input gradients), so its frozen
    attention (c_h, c_q, c_kv, c_a, c_1 terms) is kept only with a target reading the layer
    input, its MLP (the c_i term) only with a target at or before the MLP's input (parallel
    blocks: only with an MLP input target). A lower bound: the norms are counted as kept."""
    c_h, c_q, c_kv, c_i, c_a, c_1, _ = row
    shorts = {name.rsplit(".", 1)[-1] for name, _, _ in targets}
    d = facts.head_dim
    attention = (
        c_h * facts.hidden_size
        + c_q * facts.num_attention_heads * d
        + c_kv * facts.num_key_value_heads * d
        + c_a * facts.num_attention_heads
        + c_1
    )
    mlp = c_i * facts.intermediate_size
    attn_in = bool(shorts & _ATTENTION_INPUT)
    attn_out = any(reads_attention(name) for name, _, _ in targets)
    mlp_in = bool(shorts & _MLP_INPUT) or (style not in _PARALLEL and (attn_in or attn_out))
    return (0 if attn_in else attention) + (0 if mlp_in else mlp)


def lora_mode(wl: Workload) -> str:
    """The mode of a LoRA layer's activations (qlora: prepare_model_for_kbit_training's fp32 parts)."""
    half = wl.weight_dtype != "float32" and wl.adapters is not None and wl.adapters.method == "lora"
    if wl.amp is not None and wl.engine in ("fsdp", "deepspeed"):
        return "half"  # the engine gathers 16-bit parameters (activations.py mode_of)
    if half:
        return "half-amp" if wl.amp is not None else "half"
    return "amp" if wl.amp is not None else "fp32"


def targets_of_layer(facts: ModelFacts, target_modules: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of the targets in the first layer (every layer has the same)."""
    return [layer for layer in facts.first_layer_linears if any(peft_matches(layer[0], t) for t in target_modules)]


def reads_attention(name: str) -> bool:
    """Whether the linear layer `name` reads the attention output."""
    short = name.rsplit(".", 1)[-1]
    return (short in ATTENTION_OUTPUT and ("attn" in name or "attention" in name)) or name.endswith("attention.output.dense")


def adapter_inputs(style: str, targets: list[tuple[str, int, int]], shared: bool) -> int:
    """Values per token the adapters' lora_A keep as inputs in one layer."""
    if not shared:
        return sum(fi for _, fi, _ in targets)
    seen: set = set()
    total = 0
    for name, fi, _ in targets:
        short = name.rsplit(".", 1)[-1]
        if reads_attention(name) or short in _KEPT_INPUT.get(style, ()):
            continue
        group = next((i for i, g in enumerate(SHARED_INPUT.get(style, ())) if short in g), None)
        key = short if group is None else group
        if key not in seen:
            seen.add(key)
            total += fi
    return total


def lora_layer_bytes(facts: ModelFacts, wl: Workload, style: str) -> tuple[int, int, int, str | None]:
    """(per-token bytes, per-layer bytes) one LoRA layer keeps for backward, the per-token bytes the
    first layer keeps less (first_layer_saving; 0 with checkpointing), and a note if no row."""
    a = wl.adapters
    assert a is not None, "lora_layer_bytes prices an adapter workload"
    mode = lora_mode(wl)
    row = ROWS.get((style, mode, a.method)) or ROWS.get((style, mode, "lora"))
    note = None
    if row is None:
        row = ROWS[("llama", mode, "lora")]
        note = f"no measured LoRA activation row for {style} ({mode}): the Llama block's is used"
    c_h, c_q, c_kv, c_i, c_a, c_1, c_in = row
    h, i, d = facts.hidden_size, facts.intermediate_size, facts.head_dim
    per_token = (
        c_h * h
        + c_q * facts.num_attention_heads * d
        + c_kv * facts.num_key_value_heads * d
        + c_i * i
        + c_a * facts.num_attention_heads
        + c_1
    )
    targets = targets_of_layer(facts, a.target_modules)
    # with lora_dropout every target's lora_A reads its own dropout output, shared by none
    per_token += c_in * adapter_inputs(style, targets, shared=mode == "fp32" and a.lora_dropout == 0)
    c_r = 2 if mode in ("amp", "half-amp") else 4  # lora_A's output: 16-bit under autocast, else fp32
    per_token += c_r * a.r * len(targets)
    if a.lora_dropout > 0:
        per_token += sum(fi for _, fi, _ in targets)  # bool mask per element
    per_layer = 0
    if a.use_dora:
        c_out, c_out_attn, c_out_drop, c_w = _DORA[(mode, a.method)]
        for name, fi, fo in targets:
            if a.lora_dropout > 0:
                per_token += c_out_drop * fo
                per_layer += c_w * fi * fo
            else:
                per_token += (c_out_attn if reads_attention(name) else c_out) * fo
            per_layer += 12 * fo
    saving = 0 if wl.gradient_checkpointing else first_layer_saving(style, row, facts, targets)
    return per_token, per_layer, saving, note


def dora_transient_bytes(facts: ModelFacts, wl: Workload) -> int:
    """The largest transient DoRA builds in one target's forward: eye(in) in fp32 (and its 16-bit
    cast under autocast), the lora weight, weight + lora weight and the weight's cast copy."""
    a = wl.adapters
    if a is None or not a.use_dora:
        return 0
    amp = wl.amp is not None
    worst = 0
    for _, fi, fo in targets_of_layer(facts, a.target_modules):
        # get_lora_weight: eye and its 16-bit cast, the lora weight and its cast to x's dtype;
        # then get_weight_norm: the weight's copy, scaling * lora weight and their sum
        worst = max(worst, fi * fi * (6 if amp else 4) + fi * fo * 6, fi * fo * 14)
    return worst
