"""Measure real training-step memory on a CUDA GPU and compare it with the plan.

For a matrix of small real models (random init from configs, no downloads) this
runs two real optimizer steps the way transformers.Trainer does (autocast,
checkpointing, the planned optimizer, gradient accumulation, zero_grad), reads
torch.cuda.max_memory_allocated / max_memory_reserved and the device total from
torch.cuda.mem_get_info, and prints them beside gpuplan's analytic and traced
estimates. Without CUDA it says so and exits 0.

    python benchmarks/gpu_memory_check.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuplan.plan.memory.types import Workload  # noqa: E402

MODELS = {
    "llama": dict(model_type="llama", hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),
    "gpt2": dict(model_type="gpt2", n_embd=512, n_layer=4, n_head=8, vocab_size=32000, n_positions=2048),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                     num_attention_heads=8, vocab_size=32000, max_position_embeddings=2048),
    "bert": dict(model_type="bert", hidden_size=512, intermediate_size=2048, num_hidden_layers=4,
                 num_attention_heads=8, vocab_size=30522, max_position_embeddings=2048),
}

CASES = [
    ("llama", Workload(8, 512, amp="bf16", optim="adamw_torch")),
    ("llama", Workload(8, 512, amp="bf16", optim="adamw_torch_fused", gradient_checkpointing=True)),
    ("llama", Workload(4, 1024, weight_dtype="bfloat16", optim="adamw_8bit")),
    ("llama", Workload(2, 512, optim="adafactor")),
    ("llama", Workload(4, 512, amp="fp16", attn_implementation="eager", gradient_accumulation_steps=2)),
    ("gpt2", Workload(8, 512, amp="bf16", optim="adamw_torch_fused")),
    ("gpt_neox", Workload(8, 512, weight_dtype="bfloat16", optim="sgd")),
    ("bert", Workload(16, 256, amp="bf16", task="masked-lm")),
]


def run_real(config: dict, wl: Workload) -> dict:
    """Two real optimizer steps on cuda:0; returns measured bytes."""
    import torch

    from gpuplan.trace.build import build_model, make_batch, optimizer_for

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free0, total = torch.cuda.mem_get_info()
    with torch.device("cuda"):
        model = build_model(config, wl)
        optimizer, _ = optimizer_for(model, wl)
    if hasattr(optimizer, "update_step") and type(optimizer).__name__.endswith("NoKernel"):
        optimizer.__class__ = optimizer.__class__.__mro__[1]  # real bitsandbytes kernels on a GPU
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[wl.amp]
    vocab = model.config.vocab_size
    for _ in range(2):
        for _ in range(wl.gradient_accumulation_steps):
            batch = {k: v.cuda() for k, v in make_batch(wl, vocab).items()}
            with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                loss = model(**batch).loss
            (loss / wl.gradient_accumulation_steps).backward()
            del loss, batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    out = dict(allocated=torch.cuda.max_memory_allocated(), reserved=torch.cuda.max_memory_reserved(),
               device_used=total - free1, device_used_before=total - free0)
    del model, optimizer
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_memory_check: torch is not installed; nothing to measure.")
        return 0
    if not torch.cuda.is_available():
        print("gpu_memory_check: no CUDA device here; this check measures real GPU memory and needs one. "
              "Skipped (exit 0).")
        return 0
    from gpuplan.modelinfo import model_facts
    from gpuplan.plan.memory.estimate import estimate_memory
    from gpuplan.trace import trace_memory

    cc = torch.cuda.get_device_capability()
    torch.cuda.init()
    rows = []
    print(f"device: {torch.cuda.get_device_name()} (sm{cc[0]}{cc[1]})")
    print(f"{'case':58s} {'alloc MiB':>10s} {'analytic':>9s} {'traced':>9s} {'reserved':>9s} {'plan rsv':>9s} {'smi':>9s}")
    for fam, wl in CASES:
        cfg = MODELS[fam]
        facts = model_facts(cfg, wl.task, wl.num_labels)
        analytic = estimate_memory(facts, wl)
        traced = trace_memory(cfg, wl, compute_capability=cc)
        real = run_real(cfg, wl)
        name = (f"{fam} b{wl.per_device_batch} s{wl.seq_len} {wl.weight_dtype} amp={wl.amp} {wl.optim} "
                f"ckpt={int(wl.gradient_checkpointing)} {wl.attn_implementation} acc={wl.gradient_accumulation_steps}")
        mib = 2**20
        row = dict(case=name, measured=real, analytic=analytic.to_dict(), traced=traced.to_dict(),
                   analytic_err=(analytic.allocated_peak_bytes - real["allocated"]) / real["allocated"],
                   traced_err=(traced.allocated_peak_bytes - real["allocated"]) / real["allocated"])
        rows.append(row)
        print(f"{name:58s} {real['allocated'] / mib:10.1f} {row['analytic_err']:+9.1%} {row['traced_err']:+9.1%} "
              f"{real['reserved'] / mib:9.1f} {analytic.reserved_peak_bytes / mib:9.1f} {real['device_used'] / mib:9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
