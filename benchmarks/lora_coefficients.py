"""Re-derive the per-layer activation coefficients of LoRA / QLoRA (gpuplan/plan/estimate/memory/lora_activations.py).

As benchmarks/memory_coefficients.py does for full fine-tuning: traces the forward of 1-
and 2-layer peft models (FakeTensorMode, the real peft LoRA layers; qlora: the real
bitsandbytes 4-bit layers, trace/adapters.py) at several widths, two sequence lengths,
two ranks and three target subsets (all linear layers, the attention targets, the rest),
and least-squares fits the bytes one more layer keeps per token as

    c_h*h + c_q*(a*d) + c_kv*(kv*d) + c_i*i + c_a*a + c_1      (the frozen layer, grad flowing)
    + c_in * (sum of the targets' in_features) + c_r * r * (targets)   (each adapter's own)

plus a per-layer constant (bias casts). A subset's row is the frozen layer plus its targets:
integer coefficients with ~0 residual over the three subsets mean the model is additive. (A
lone MLP target adds 2 x head_dim x 2 bytes per token in the 2-layer model: the rotary
cos/sin that layer 0's frozen attention needs no gradient for; outside the layers, not fitted.)
Autocast rows subtract the 16-bit weight copies (autocast's cache of the trainable fp32
adapters, and the per-op casts of frozen fp32 base weights saved for the input gradient),
which adapters.py prices apart.

Modes: fp32, amp (fp32 weights under bf16 autocast), half (bf16 weights), half-amp (bf16
weights under bf16 autocast: what a plan runs for model.dtype = "bfloat16" on Ampere+).

    python benchmarks/lora_coefficients.py llama half-amp lora
    python benchmarks/lora_coefficients.py all        # every (style, mode, method) row, as a table
    python benchmarks/lora_coefficients.py --quick    # CI: llama fp32 lora, the first width (underdetermined)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_coefficients import FAMILIES  # noqa: E402

MODES = {"fp32": {}, "amp": {"amp": "bf16"}, "half": {"weight_dtype": "bfloat16"}, "half-amp": {"weight_dtype": "bfloat16", "amp": "bf16"}}
ATTENTION_TARGETS = {
    "llama": ["q_proj", "v_proj"],
    "gemma": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "gpt_neox": ["query_key_value"],
    "bert": ["query", "value"],
    "opt": ["q_proj", "v_proj"],
    "phi": ["q_proj", "v_proj"],
}


def forward_activation_bytes(config: dict, wl) -> int:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gpuplan.trace import _unpacked_sequences
    from gpuplan.trace.adapters import fake_4bit_dequant
    from gpuplan.trace.build import build_model, make_batch
    from gpuplan.trace.cuda_ops import cuda_like_ops
    from gpuplan.trace.tracker import StorageTracker

    with _unpacked_sequences(), cuda_like_ops(), fake_4bit_dequant(), FakeTensorMode(allow_non_fake_inputs=True):
        model = build_model(config, wl)
        tracker = StorageTracker()
        tracker.track_model(model)
        amp = {"bf16": torch.bfloat16, None: None}[wl.amp]
        with tracker:
            batch = make_batch(wl, model.config.vocab_size)
            tracker.phase = "forward"
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                out = model(**batch)
            kept = tracker.counters.get("activations", 0)
            del out
        tracker.close()
        if wl.amp:  # autocast's 16-bit copies of the layers' fp32 matrices (priced in adapters.py)
            kept -= sum(
                2 * p.numel()
                for n, p in model.named_parameters()
                if re.search(r"(layers|layer|h)[.][0-9]+[.]", n)
                and not re.search(r"norm|ln_|LayerNorm", n)
                and p.dtype == torch.float32
                and p.dim() >= 2
            )
        return kept


def _subsets(family: str, names: list[str]) -> list[list[str]]:
    attn = [t for t in ATTENTION_TARGETS[family] if t in names]
    rest = [t for t in names if t not in attn]
    return [names, attn, rest]


def fit(family: str, mode: str, method: str, widths: int | None = None) -> dict[str, float]:
    """`widths`: only the first that many model widths (a quick run; fewer rows than coefficients)."""
    import numpy as np

    from gpuplan.modelinfo import model_facts
    from gpuplan.modelinfo.lora_targets import resolve_targets
    from gpuplan.plan.estimate.memory.lora_activations import adapter_inputs, targets_of_layer
    from gpuplan.plan.estimate.memory.types import Adapters, Workload

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
    for n, (h, a, d, kv, i) in enumerate(variants[:widths]):
        for s in (64, 128):
            cfg1, cfg2 = FAMILIES[family](h, a, d, kv, i, 1), FAMILIES[family](h, a, d, kv, i, 2)
            facts = model_facts(cfg1, task)
            for k, targets in enumerate(_subsets(family, resolve_targets(facts, "all-linear", []))):
                r = 8 if (n + k) % 2 else 16
                wl = Workload(1, s, task=task, **MODES[mode], adapters=Adapters(method=method, r=r, target_modules=tuple(targets)))
                hit = targets_of_layer(facts, tuple(targets))
                inputs = adapter_inputs(family, hit, shared=mode == "fp32")
                y = forward_activation_bytes(cfg2, wl) - forward_activation_bytes(cfg1, wl)
                rows.append([s * h, s * a * d if gqa else 0, s * kv * d if gqa else 0, s * i, s * a, s, s * inputs, s * r * len(hit), 1])
                ys.append(y)
    x, y = np.array(rows, float), np.array(ys, float)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    names = ["c_h", "c_q", "c_kv", "c_i", "c_a", "c_1", "c_in", "c_r", "per_layer_const"]
    out = {n: round(float(c), 3) for n, c in zip(names, coef)}
    out["max_residual_bytes"] = float(np.max(np.abs(x @ coef - y)))
    return out


ROWS = [(f, m, "lora") for f in ATTENTION_TARGETS for m in MODES] + [
    (f, m, "qlora") for f in ATTENTION_TARGETS if f != "bert" for m in ("amp", "fp32")
]
if os.environ.get("LORA_FIT_MODES"):  # e.g. LORA_FIT_MODES=half-amp: only those rows
    ROWS = [r for r in ROWS if r[1] in os.environ["LORA_FIT_MODES"].split(",")]
if os.environ.get("LORA_FIT_FAMILIES"):
    ROWS = [r for r in ROWS if r[0] in os.environ["LORA_FIT_FAMILIES"].split(",")]

if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    if sys.argv[1:] == ["all"]:
        for fam, mode, method in ROWS:
            c = fit(fam, mode, method)
            ints = tuple(round(c[k]) for k in ("c_h", "c_q", "c_kv", "c_i", "c_a", "c_1", "c_in"))
            print(
                f"    ({fam!r}, {mode!r}, {method!r}): {ints},  # c_r {c['c_r']}, const {c['per_layer_const']:.0f}, "
                f"residual {c['max_residual_bytes']:.0f}",
                flush=True,
            )
    elif sys.argv[1:] == ["--quick"]:
        print("llama fp32 lora fit:", fit("llama", "fp32", "lora", widths=1))
    else:
        fam, mode, method = sys.argv[1:4]
        print(fam, mode, method, "fit:", fit(fam, mode, method))
