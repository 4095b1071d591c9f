"""The bytes a peft LoRA adapter moves beside its frozen linear, traced, against what the step-time model prices.

plan/estimate/step_time/shape.py prices a LoRA adapter's own work (the input cast, dropout, the two thin matmuls, the
scaling, the add and the cast back: peft/tuners/lora/layer.py Linear.forward) as memory traffic, in bytes per element
of the adapted linear's input (fan_in) and output (fan_out), forward and backward, by the dtypes the path runs in
(ADAPTER_BYTES, adapter_mode). This script measures those bytes on the installed torch and peft:

- a module holding one frozen nn.Linear(fan_in, fan_out) runs a forward and a backward (the gradient of its input
  too, as inside a model) on T tokens, with and without a peft LoRA adapter (r 8) on it, under a TorchDispatchMode
  that adds up, for every aten op that does work (views and metadata ops left out: kernel_counts.NO_WORK), the bytes
  of its tensor inputs and outputs; the adapter's bytes are the difference, so the frozen linear's own GEMMs cancel;
- two shapes, (fan_in, fan_out) = (512, 256) and (256, 512), give the per-element coefficients by solving
  bytes / T = a fan_in + b fan_out for each pass (the r-sized intermediates, ~1% here, land in a and b);
- the modes are the dtypes the path can run in (the keys of shape.ADAPTER_BYTES): fp32 everywhere; fp32 base under bf16 autocast;
  a bf16 base with fp32 adapters (peft >= 0.12's autocast_adapter_dtype) without and with bf16 autocast; adapters in
  the base's bf16 (peft < 0.12, or an engine that gathers 16-bit parameters); each without and with lora_dropout.

CPU autocast casts the same ops as CUDA autocast (linear and matmul to the low precision, elementwise ops promote),
so the traffic is the GPU's. Dropout is the exception: on a CUDA tensor torch.dropout runs the fused
aten::native_dropout (read x, write the output and a bool mask), on a CPU one a composite of bernoulli_ on a float
mask, div_ and mul; the trace runs the adapter's dropout through aten::native_dropout, as CUDA does. The input is
not a leaf (autocast caches the casts of leaves, which would let the adapter reuse the frozen linear's cast).

    python benchmarks/adapter_traffic.py [--no-write]
    python benchmarks/adapter_traffic.py --quick   # CI: 1,024 tokens, writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results import write_section  # noqa: E402
from traced_bytes import byte_counter  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "adapter_traffic.json"
TOKENS = 4096
RANK = 8
SHAPES = ((512, 256), (256, 512))
DROPOUT = 0.1
# mode -> (base weights in bf16, adapters kept in the base's dtype, bf16 autocast); see shape.ADAPTER_BYTES
SETUPS = {
    "fp32": (False, False, False),
    "amp": (False, False, True),
    "half": (True, False, False),
    "half-amp": (True, False, True),
    "16-bit": (True, True, False),
}


def traced(mode: str, fan_in: int, fan_out: int, dropout: float, adapter: bool, tokens: int = TOKENS) -> tuple[int, int]:
    """(forward bytes, backward bytes) of one frozen linear, with or without a LoRA adapter, in `mode`."""
    import torch
    from torch import nn

    bf16, keep_dtype, amp = SETUPS[mode]
    dtype = torch.bfloat16 if bf16 else torch.float32
    torch.manual_seed(0)

    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(fan_in, fan_out, bias=False)

        def forward(self, x):
            return self.proj(x)

    model: nn.Module = One().to(dtype)
    if adapter:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=RANK, lora_alpha=16, lora_dropout=dropout, target_modules=["proj"])
        model = get_peft_model(model, config, autocast_adapter_dtype=not keep_dtype)
    else:
        model.proj.weight.requires_grad_(False)  # frozen, as get_peft_model leaves the base
    model.train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):  # CUDA's fused dropout (module docstring)
            m.forward = lambda t, p=m.p: torch.native_dropout(t, p, True)[0]
    leaf = torch.randn(tokens, fan_in, dtype=dtype, requires_grad=True)
    x = leaf * 1  # a layer's input is an activation, not a leaf (module docstring)
    Bytes = byte_counter()  # every op: the frozen linear's GEMMs cancel in the difference
    with Bytes() as fwd, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        y = model(x)
    grad = torch.ones_like(y)
    with Bytes() as bwd:
        y.backward(grad)
    return fwd.total, bwd.total


def coefficients(mode: str, dropout: float, tokens: int = TOKENS) -> dict[str, float]:
    """Bytes per fan_in and per fan_out element, forward and backward, the adapter adds (solved from two shapes)."""
    rows = []
    for fi, fo in SHAPES:
        with_adapter = traced(mode, fi, fo, dropout, adapter=True, tokens=tokens)
        bare = traced(mode, fi, fo, dropout, adapter=False, tokens=tokens)
        rows.append((fi, fo, [(a - b) / tokens for a, b in zip(with_adapter, bare)]))
    (i1, o1, d1), (i2, o2, d2) = rows
    det = i1 * o2 - i2 * o1
    out = {}
    for k, name in enumerate(("forward", "backward")):
        out[f"{name}_in"] = round((d1[k] * o2 - d2[k] * o1) / det, 2)
        out[f"{name}_out"] = round((i1 * d2[k] - i2 * d1[k]) / det, 2)
    return out


def measure(tokens: int = TOKENS) -> dict:
    import peft
    import torch

    table = {f"{mode}{', dropout' if p else ''}": coefficients(mode, p, tokens) for mode in SETUPS for p in (0.0, DROPOUT)}
    return {"torch": torch.__version__, "peft": peft.__version__, "tokens": tokens, "rank": RANK, "coefficients": table}


def modelled(key: str) -> dict[str, float]:
    """shape.ADAPTER_BYTES for a coefficients key ("half-amp, dropout"), in measure()'s form."""
    from gpuplan.plan.estimate.step_time.shape import ADAPTER_BYTES

    mode, _, drop = key.partition(", ")
    m = ADAPTER_BYTES[mode]
    extra = m["dropout"] if drop else (0, 0)
    return {
        "forward_in": m["forward"][0] + extra[0],
        "forward_out": m["forward"][1],
        "backward_in": m["backward"][0] + extra[1],
        "backward_out": m["backward"][1],
    }


def worst_difference(data: dict) -> float:
    """The largest |traced - modelled| bytes per element over every path, pass and side."""
    return max(abs(c[k] - modelled(key)[k]) for key, c in data["coefficients"].items() for k in c)


def section(data: dict) -> str:
    lines = [
        f"Bytes per element of an adapted linear's input (in) and output (out) that a peft LoRA adapter (r {data['rank']}) "
        f"moves beside the frozen linear, traced with a TorchDispatchMode on torch {data['torch']} and peft {data['peft']} "
        f"({data['tokens']} tokens, CPU; bf16 autocast where named), beside shape.ADAPTER_BYTES, which the step-time model "
        "prices (forward + backward; the forward again when checkpointing recomputes it).",
        "",
        "| path | traced fwd in / out | traced bwd in / out | model fwd in / out | model bwd in / out |",
        "|---|---|---|---|---|",
    ]
    for key, c in data["coefficients"].items():
        m = modelled(key)
        lines.append(
            f"| {key} | {c['forward_in']:g} / {c['forward_out']:g} | {c['backward_in']:g} / {c['backward_out']:g} | "
            f"{m['forward_in']:g} / {m['forward_out']:g} | {m['backward_in']:g} / {m['backward_out']:g} |"
        )
    lines += [
        "",
        f"Largest difference: {worst_difference(data):.2f} B per element (the r-sized intermediates).",
        "",
        "Before this table the model priced every adapter at (2 in + 5 out) elements of the activation's dtype a pass "
        "(4 / 10 bytes forward in bf16), whatever the adapter's dtype, the autocast and the dropout.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-write", action="store_true", help="print, write neither the data nor RESULTS.md")
    ap.add_argument("--quick", action="store_true", help="CI: 1,024 tokens, nothing written")
    args = ap.parse_args(argv)
    data = measure(1024 if args.quick else TOKENS)
    print(json.dumps(data["coefficients"], indent=1))
    print(f"adapter bytes, traced vs modelled: largest difference {worst_difference(data):.2f} B per element")
    if not (args.no_write or args.quick):
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        write_section("adapter_traffic", "LoRA adapter path, bytes traced", section(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
