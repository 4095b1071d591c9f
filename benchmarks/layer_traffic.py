"""The bytes a transformers decoder layer's elementwise work moves, traced, beside the step-time model's count.

plan/estimate/step_time/terms.py memory_terms prices a decoder layer's work outside the GEMMs and the attention
kernel (the norms, rotary, the residual adds, the activation, the casts) as ELEMENTWISE_H x hidden +
ELEMENTWISE_F x intermediate elements of the compute dtype per token, a hand count of the reads and writes of
fused kernels, forward, and BACKWARD_BYTES_RATIO times that backward. This script measures what eager transformers
runs instead:

- a tiny LlamaForCausalLM (hidden 256, 4 heads, SDPA), every weight trained, and again with every weight frozen
  (a LoRA run's base: the backward computes the input gradients alone, no norm weight's gradient), with 2 and with 4
  decoder layers runs a forward and a backward on 1,024 and on 2,048 tokens under traced_bytes.byte_counter, the GEMMs, the embedding
  and the attention kernel left out (traced_bytes.COMPUTE_OPS); per layer and token = the difference over the
  layers, divided by 2, and over the tokens, divided by 1,024 (what a step moves once, its weights' casts and
  gradients, drops out);
- two intermediate sizes (512 and 1,024) separate the bytes per hidden element from those per intermediate one;
- precisions: bf16 weights without autocast (pure bf16), fp32 weights under bf16 autocast (mixed precision; a QLoRA
  base after prepare_model_for_kbit_training runs its norms and residual stream so too), fp32.

transformers' RMSNorm upcasts to fp32 and back, its rotary builds rotate_half with a slice, a neg and a cat, and
each is an eager kernel of its own on a GPU as on a CPU: the bytes are the GPU's unless a run fuses them (Liger,
torch.compile, flash-attn's fused RMSNorm and rotary, which some published runs used). The step-time model prices
an eager Llama-family layer on a GPU by these figures (terms.EAGER_LLAMA_BYTES, kept equal to a trace by a test) and
a fused one, a family not traced here or a CPU's by its hand count (shape.eager_stream).

    python benchmarks/layer_traffic.py [--no-write]
    python benchmarks/layer_traffic.py --quick   # CI: 256 and 512 tokens, writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import write_section  # noqa: E402
from traced_bytes import COMPUTE_OPS, byte_counter  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "layer_traffic.json"
HIDDEN = 256
INTERMEDIATES = (512, 1024)
LAYERS = (2, 4)
TOKENS = (1024, 2048)
# precision -> (weights in bf16, bf16 autocast)
PRECISIONS = {"bf16": (True, False), "amp": (False, True), "fp32": (False, False)}


def traced(layers: int, intermediate: int, precision: str, tokens: int, frozen: bool = False) -> tuple[int, int]:
    """(forward, backward) bytes of the whole model's elementwise work; `frozen`: no weight trains, the embedding's
    output requires a gradient (transformers' enable_input_require_grads, as peft does for a frozen base)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    bf16, amp = PRECISIONS[precision]
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=128,
        max_position_embeddings=tokens,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    if bf16:
        model = model.to(torch.bfloat16)
    model.train()
    if frozen:
        model.requires_grad_(False)
        model.enable_input_require_grads()
    ids = torch.randint(0, 128, (1, tokens))
    Bytes = byte_counter(COMPUTE_OPS)
    with Bytes() as fwd, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        logits = model(input_ids=ids).logits
    grad = torch.ones_like(logits)
    with Bytes() as bwd:
        logits.backward(grad)
    return fwd.total, bwd.total


def measure(tokens: tuple[int, int] = TOKENS) -> dict:
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokens": tokens,
        "coefficients": _coefficients(tokens, frozen=False),
        "frozen": _coefficients(tokens, frozen=True),
    }


def _coefficients(tokens: tuple[int, int], frozen: bool) -> dict:
    out = {}
    for precision in PRECISIONS:
        per_layer = []
        for f in INTERMEDIATES:
            run = {(n, t): traced(n, f, precision, t, frozen) for n in LAYERS for t in tokens}
            per_layer.append(
                [
                    (
                        run[LAYERS[1], tokens[1]][k]
                        - run[LAYERS[0], tokens[1]][k]
                        - run[LAYERS[1], tokens[0]][k]
                        + run[LAYERS[0], tokens[0]][k]
                    )
                    / (LAYERS[1] - LAYERS[0])
                    / (tokens[1] - tokens[0])
                    for k in (0, 1)
                ]
            )
        (f1, f2), (p1, p2) = INTERMEDIATES, per_layer
        coef = {}
        for k, name in enumerate(("forward", "backward")):
            per_f = (p2[k] - p1[k]) / (f2 - f1)
            coef[f"{name}_h"] = round((p1[k] - per_f * f1) / HIDDEN, 1)
            coef[f"{name}_f"] = round(per_f, 1)
        out[precision] = coef
    return out


def hand_count(precision: str) -> dict[str, float]:
    """The hand count's bytes per hidden and per intermediate element of a Llama layer, forward and backward (what
    terms.memory_terms prices a fused layer at)."""
    from gpuplan.plan.estimate.step_time.terms import BACKWARD_BYTES_RATIO, ELEMENTWISE_F, ELEMENTWISE_H

    act = 4 if precision == "fp32" else 2
    return {
        "forward_h": ELEMENTWISE_H * act,
        "forward_f": ELEMENTWISE_F * act,
        "backward_h": ELEMENTWISE_H * act * BACKWARD_BYTES_RATIO,
        "backward_f": ELEMENTWISE_F * act * BACKWARD_BYTES_RATIO,
    }


def ratio(data: dict, precision: str, hidden: int, intermediate: int) -> float:
    """Traced over hand-count bytes of a layer (forward + backward) at a model's hidden and intermediate sizes."""
    c, m = data["coefficients"][precision], hand_count(precision)
    total = {k: sum(x[f"{p}_h"] * hidden + x[f"{p}_f"] * intermediate for p in ("forward", "backward")) for k, x in (("t", c), ("m", m))}
    return total["t"] / total["m"]


def section(data: dict) -> str:
    lines = [
        f"Bytes per token a Llama decoder layer's elementwise work moves (everything but the GEMMs, the embedding and "
        f"the attention kernel), per hidden (h) and per intermediate (f) element, traced on torch {data['torch']} and "
        f"transformers {data['transformers']} ({' and '.join(map(str, data['tokens']))} tokens, CPU, SDPA), beside the hand count "
        "(ELEMENTWISE_H h + ELEMENTWISE_F f elements of the compute dtype forward, BACKWARD_BYTES_RATIO x that "
        "backward), which the model keeps for fused layers.",
        "",
        "| residual stream | traced fwd h / f | traced bwd h / f | traced bwd h / f, frozen weights | hand count fwd h / f "
        "| hand count bwd h / f | traced / hand count, Llama-2-7B layer |",
        "|---|---|---|---|---|---|---|",
    ]
    for precision, c in data["coefficients"].items():
        m, z = hand_count(precision), data["frozen"][precision]
        lines.append(
            f"| {precision} | {c['forward_h']:g} / {c['forward_f']:g} | {c['backward_h']:g} / {c['backward_f']:g} | "
            f"{z['backward_h']:g} / {z['backward_f']:g} | "
            f"{m['forward_h']:g} / {m['forward_f']:g} | {m['backward_h']:g} / {m['backward_f']:g} | "
            f"{ratio(data, precision, 4096, 11008):.1f}x |"
        )
    lines += [
        "",
        "Eager transformers moves several times the bytes of the hand count for the same layer: RMSNorm's fp32 upcast, "
        "square, mean, rsqrt, two multiplies and the cast back; rotary's slices, neg, cat and multiplies; the casts "
        "autocast inserts before every linear of an fp32 residual stream. On a GPU the step-time model prices an eager "
        "Llama-family layer (gpuplan's apply without Liger; the published runs of transformers' or LitGPT's own code) "
        "by the traced figures (terms.EAGER_LLAMA_BYTES) and a fused one (Liger; torch.compile; Qwen's modeling code "
        "with flash-attn's RMSNorm and rotary kernels) by the hand count; benchmarks/published_rows.py says which each "
        "source ran (FUSED_SOURCES). A CPU plan keeps the hand count (shape.eager_stream says why). A frozen base "
        "(LoRA, QLoRA) runs the frozen backward (terms.EAGER_LLAMA_FROZEN_BACKWARD): its norms' weights take no "
        "gradient, so the multiply by the normalized input, the reduction over the tokens and, in an fp32 stream, "
        "their casts do not run.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-write", action="store_true", help="print, write neither the data nor RESULTS.md")
    ap.add_argument("--quick", action="store_true", help="CI: 256 and 512 tokens, nothing written")
    args = ap.parse_args(argv)
    data = measure((256, 512) if args.quick else TOKENS)
    print(json.dumps({"trained": data["coefficients"], "frozen": data["frozen"]}, indent=1))
    print(f"layer bytes, traced / hand count (Llama-2-7B, bf16): {ratio(data, 'bf16', 4096, 11008):.2f}x")
    if not (args.no_write or args.quick):
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        write_section("layer_traffic", "Decoder layer's elementwise bytes, traced", section(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
