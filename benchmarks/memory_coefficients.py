"""Re-derive the per-layer activation coefficients of gpuplan/plan/estimate/memory/activations.py.

For one family and mode, traces the forward of 1- and 2-layer models (FakeTensorMode,
gpuplan.trace) at several widths and two sequence lengths, takes the bytes one more
layer keeps for backward, and least-squares fits them per token as
c_h*h + c_q*(a*d) + c_kv*(kv*d) + c_i*i + c_a*a + c_1 (+ c_as*a*s). AMP rows subtract
the 16-bit weight copies (a per-layer constant, modelled separately). Prints the fit
beside the table row; integer coefficients with ~0 residual mean the table is exact.

    python benchmarks/memory_coefficients.py llama amp [sdpa|eager]
    python benchmarks/memory_coefficients.py --quick   # CI: llama fp32, the first width (the fit is underdetermined)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FAMILIES = {  # (h, a, d, kv, i, layers) -> config
    "llama": lambda h, a, d, kv, i, n: dict(
        model_type="llama",
        hidden_size=h,
        head_dim=d,
        intermediate_size=i,
        num_hidden_layers=n,
        num_attention_heads=a,
        num_key_value_heads=kv,
        vocab_size=128,
    ),
    "gemma": lambda h, a, d, kv, i, n: dict(
        model_type="gemma",
        hidden_size=h,
        head_dim=d,
        intermediate_size=i,
        num_hidden_layers=n,
        num_attention_heads=a,
        num_key_value_heads=kv,
        vocab_size=128,
    ),
    "gpt2": lambda h, a, d, kv, i, n: dict(model_type="gpt2", n_embd=h, n_inner=i, n_layer=n, n_head=a, vocab_size=128, n_positions=1024),
    "gpt_neox": lambda h, a, d, kv, i, n: dict(
        model_type="gpt_neox", hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=a, vocab_size=128
    ),
    "bert": lambda h, a, d, kv, i, n: dict(
        model_type="bert", hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=a, vocab_size=128
    ),
    "opt": lambda h, a, d, kv, i, n: dict(
        model_type="opt", hidden_size=h, ffn_dim=i, num_hidden_layers=n, num_attention_heads=a, vocab_size=128, word_embed_proj_dim=h
    ),
    "phi": lambda h, a, d, kv, i, n: dict(
        model_type="phi", hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=a, vocab_size=128
    ),
}
MODES = {"fp32": {}, "amp": {"amp": "bf16"}, "half": {"weight_dtype": "bfloat16"}, "half-amp": {"weight_dtype": "bfloat16", "amp": "bf16"}}


def forward_activation_bytes(config: dict, wl) -> int:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpuplan.trace import _unpacked_sequences
    from gpuplan.trace.build import build_model, make_batch
    from gpuplan.trace.cuda_ops import cuda_like_ops
    from gpuplan.trace.tracker import StorageTracker

    with _unpacked_sequences(), cuda_like_ops(), FakeTensorMode(allow_non_fake_inputs=True):
        model = build_model(config, wl)
        tracker = StorageTracker()
        tracker.track_model(model)
        amp = {"bf16": torch.bfloat16, None: None}[wl.amp]
        with tracker:
            batch = make_batch(wl, model.config.vocab_size)
            tracker.phase = "forward"
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                out = model(**batch)  # keep the graph alive: what it holds is what we count
            kept = tracker.counters.get("activations", 0)
            del out
        tracker.close()
        if wl.amp:  # minus the cached 16-bit weight copies of the layers (fp32 weights only)
            kept -= sum(
                2 * p.numel()
                for n, p in model.named_parameters()
                if re.search(r"(layers|layer|h)[.][0-9]+[.]", n) and not re.search(r"norm|ln_|LayerNorm", n) and p.dtype == torch.float32
            )
        return kept


def fit(family: str, mode: str, attn: str = "sdpa", widths: int | None = None) -> dict[str, float]:
    """`widths`: only the first that many model widths (a quick run; fewer rows than coefficients)."""
    import numpy as np

    from gpuplan.plan.estimate.memory.types import Workload

    gqa = family in ("llama", "gemma")
    variants = (
        [
            (64, 4, 16, 2, 96),
            (64, 4, 16, 2, 160),
            (96, 4, 16, 2, 96),
            (64, 4, 32, 2, 96),
            (64, 8, 16, 4, 96),
            (64, 4, 16, 4, 96),
            (128, 8, 16, 8, 96),
        ]
        if gqa
        else [(64, 4, 16, 4, 96), (64, 4, 16, 4, 160), (96, 4, 24, 4, 96), (64, 8, 8, 8, 96), (128, 4, 32, 4, 96)]
    )
    task = "masked-lm" if family == "bert" else "causal-lm"
    rows, ys = [], []
    for h, a, d, kv, i in variants[:widths]:
        for s in (64, 128):
            wl = Workload(1, s, task=task, attn_implementation=attn, **MODES[mode])
            one = forward_activation_bytes(FAMILIES[family](h, a, d, kv, i, 1), wl)
            two = forward_activation_bytes(FAMILIES[family](h, a, d, kv, i, 2), wl)
            rows.append(
                [s * h, s * a * d, s * kv * d, s * i, s * a, s, s * a * s, 1] if gqa else [s * h, 0, 0, s * i, s * a, s, s * a * s, 1]
            )
            ys.append(two - one)
    x, y = np.array(rows, float), np.array(ys, float)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    names = ["c_h", "c_q", "c_kv", "c_i", "c_a", "c_1", "c_as", "per_layer_const"]
    out = {n: round(float(c), 3) for n, c in zip(names, coef)}
    out["max_residual_bytes"] = float(np.max(np.abs(x @ coef - y)))
    return out


if __name__ == "__main__":
    from gpuplan.plan.estimate.memory.activations import _SDPA, STYLE_OF

    quick = sys.argv[1:] == ["--quick"]
    fam, mode = ("llama", "fp32") if quick else (sys.argv[1], sys.argv[2])
    attn = sys.argv[3] if len(sys.argv) > 3 else "sdpa"
    print("fit:  ", fit(fam, mode, attn, widths=1 if quick else None))
    print("table:", _SDPA.get((STYLE_OF.get(fam, fam), mode)), "(sdpa row; eager: see _EAGER)")
