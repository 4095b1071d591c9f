"""Fit the MoE block's activation bytes against the fake-tensor trace (issue 11 item 14).

For tiny Mixtral variants (E experts, top-k, hidden h, intermediate i; bf16 weights) the
trace of Mixtral minus the trace of the same-width Llama is the MoE block's extra bytes per
token and layer; a least-squares fit over (hk, ik, h, i, E, k, 1) gives the formula in
gpuplan/plan/estimate/memory/activations.py moe_extra_per_token, and the analytic estimate is then
compared with the trace of the whole model.

    python benchmarks/moe_activations.py           # about a minute on 2 cores
    python benchmarks/moe_activations.py --quick   # CI: the first variant (the fit is then underdetermined)
"""

from __future__ import annotations

import numpy as np

from gpuplan.modelinfo import model_facts
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.trace import trace_memory

BASE = dict(model_type="mixtral", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=2000)
VARIANTS = (
    (4, 2, 128, 352),
    (8, 2, 128, 352),
    (4, 1, 128, 352),
    (4, 2, 256, 352),
    (8, 3, 128, 512),
    (4, 2, 192, 352),
    (4, 2, 128, 640),
    (6, 3, 256, 512),
    (4, 1, 256, 256),
    (8, 1, 128, 256),
)


def main(quick: bool = False) -> None:
    wl = Workload(4, 256, weight_dtype="bfloat16")
    tokens_layers = wl.per_device_batch * wl.seq_len * BASE["num_hidden_layers"]
    rows, extra, errors = [], [], []
    for e, k, h, i in VARIANTS[:1] if quick else VARIANTS:
        cfg = dict(BASE, num_local_experts=e, num_experts_per_tok=k, hidden_size=h, intermediate_size=i)
        dense = {key: v for key, v in cfg.items() if key not in ("num_local_experts", "num_experts_per_tok")}
        dense["model_type"] = "llama"
        traced = trace_memory(cfg, wl)
        diff = (traced.components["activations"] - trace_memory(dense, wl).components["activations"]) / tokens_layers
        rows.append([h * k, i * k, h, i, e, k, 1])
        extra.append(diff)
        analytic = estimate_memory(model_facts(cfg, "causal-lm"), wl)
        errors.append((analytic.allocated_peak_bytes - traced.allocated_peak_bytes) / traced.allocated_peak_bytes)
        print(f"E={e} k={k} h={h} i={i}: MoE extra {diff:.1f} B/token/layer; peak error {errors[-1]:+.2%}")
    coef, residual, *_ = np.linalg.lstsq(np.array(rows, float), np.array(extra), rcond=None)
    names = ("hk", "ik", "h", "i", "E", "k", "1")
    res = float(residual.sum()) if residual.size else 0
    print("fit:", ", ".join(f"{n} {c:+.2f}" for n, c in zip(names, coef)), f"(residual {res:.2g})")
    print(f"analytic vs traced peak: max |error| {max(abs(x) for x in errors):.2%}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI: the first variant only")
    main(quick=ap.parse_args().quick)
