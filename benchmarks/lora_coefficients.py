"""Re-derive the per-layer activation coefficients of LoRA / QLoRA (gpuplan/plan/estimate/memory/adapters.py).

As benchmarks/memory_coefficients.py does for full fine-tuning: traces the forward of 1-
and 2-layer peft models (FakeTensorMode, the real peft LoRA layers; qlora: the real
bitsandbytes 4-bit layers, trace/adapters.py) at several widths and two sequence
lengths, and least-squares fits the bytes one more layer keeps per token as
c_h*h + c_q*(a*d) + c_kv*(kv*d) + c_i*i + c_a*a + c_1 + c_r*r (per target).
AMP rows subtract the 16-bit weight copies (autocast's cache of the trainable adapters,
and the per-op casts of frozen 16-bit-castable base weights saved for the input gradient).

    python benchmarks/lora_coefficients.py llama amp lora all-linear
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_coefficients import FAMILIES, MODES  # noqa: E402

ATTENTION_TARGETS = {"llama": ["q_proj", "v_proj"], "gemma": ["q_proj", "v_proj"], "gpt2": ["c_attn"],
                     "gpt_neox": ["query_key_value"], "bert": ["query", "value"], "opt": ["q_proj", "v_proj"],
                     "phi": ["q_proj", "v_proj"]}


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
                out = model(**batch)
            kept = tracker.counters.get("activations", 0)
            del out
        tracker.close()
        if wl.amp:
            kept -= sum(2 * p.numel() for n, p in model.named_parameters()
                        if re.search(r"(layers|layer|h)[.][0-9]+[.]", n) and not re.search(r"norm|ln_|LayerNorm", n)
                        and p.dtype.is_floating_point and p.dim() >= 2)
        return kept


def fit(family: str, mode: str, method: str, targets: str, r: int = 8) -> dict[str, float]:
    import numpy as np

    from gpuplan.modelinfo import model_facts
    from gpuplan.modelinfo.lora_targets import resolve_targets
    from gpuplan.plan.estimate.memory.types import Adapters, Workload

    gqa = family in ("llama", "gemma")
    variants = ([(64, 4, 16, 2, 96), (64, 4, 16, 2, 160), (96, 4, 16, 2, 96), (64, 4, 32, 2, 96),
                 (64, 8, 16, 4, 96), (64, 4, 16, 4, 96), (128, 8, 16, 8, 96)] if gqa else
                [(64, 4, 16, 4, 96), (64, 4, 16, 4, 160), (96, 4, 24, 4, 96), (64, 8, 8, 8, 96), (128, 4, 32, 4, 96)])
    task = "masked-lm" if family == "bert" else "causal-lm"
    rows, ys = [], []
    for h, a, d, kv, i in variants:
        for s in (64, 128):
            cfg1 = FAMILIES[family](h, a, d, kv, i, 1)
            facts = model_facts(cfg1, task)
            names = resolve_targets(facts, "all-linear" if targets == "all-linear" else ATTENTION_TARGETS[family], [])
            ad = Adapters(method=method, r=r, target_modules=tuple(names))
            wl = Workload(1, s, task=task, adapters=ad, **MODES[mode])
            one = forward_activation_bytes(cfg1, wl)
            two = forward_activation_bytes(FAMILIES[family](h, a, d, kv, i, 2), wl)
            rows.append([s * h, s * a * d, s * kv * d, s * i, s * a, s, 1] if gqa else
                        [s * h, 0, 0, s * i, s * a, s, 1])
            ys.append(two - one)
    x, y = np.array(rows, float), np.array(ys, float)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    names = ["c_h", "c_q", "c_kv", "c_i", "c_a", "c_1", "per_layer_const"]
    out = {n: round(float(c), 3) for n, c in zip(names, coef)}
    out["max_residual_bytes"] = float(np.max(np.abs(x @ coef - y)))
    return out


if __name__ == "__main__":
    fam, mode, method, targets = sys.argv[1:5]
    print(fam, mode, method, targets, "fit:", fit(fam, mode, method, targets))
