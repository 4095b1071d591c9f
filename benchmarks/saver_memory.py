"""The peak by memory saver: Llama-3.1-8B at 2,048 and 8,192 tokens, full and QLoRA, plan vs trace.

Each case is one micro-batch (batch 1) of specs/models/llama-3.1-8b.json with a set of
savers on: none, chunked cross-entropy (training.loss_chunk_size = 1024), gradient
checkpointing, both, and a paged 8-bit AdamW. The analytic estimate (the numbers
`gpuplan plan` prints, gpuplan/plan/estimate/memory/estimate.py) is compared with the fake-tensor
trace of two real training steps of the same workload (gpuplan/trace, which runs the
chunked loss through apply/model/chunked_loss.py as apply does). Liger's kernels run on CUDA
only (Triton) and cannot be traced here, and the trace counts host copies as device
storage: the Liger and activation-offloading rows are the analytic estimate alone.
Full = bf16 weights under bf16 autocast with torch's fused AdamW; QLoRA = the
4-bit NF4 base of specs/llama-8b-qlora-4090.toml (r 16, all-linear, fp32 non-quantized
parts under bf16 autocast). Writes the `saver_memory` section of benchmarks/RESULTS.md.

    python benchmarks/saver_memory.py [--no-trace] [--no-write]
    python benchmarks/saver_memory.py --quick   # CI: the analytic figures only (--no-trace --no-write)

Traces are cached in /tmp/gpuplan-saver-traces.json (keyed by the workload): a rerun
after a change to the analytic model alone does not trace again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpuplan.modelinfo import model_facts, read_config  # noqa: E402
from gpuplan.modelinfo.lora_targets import resolve_targets  # noqa: E402
from gpuplan.plan.estimate.memory.adapters import adapter_layout  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.paging import paged_bytes  # noqa: E402
from gpuplan.plan.estimate.memory.types import Adapters, Workload  # noqa: E402

CONFIG = ROOT / "specs" / "models" / "llama-3.1-8b.json"
CACHE = Path("/tmp/gpuplan-saver-traces.json")
GIB = 1024**3
FULL = Workload(per_device_batch=1, seq_len=2048, weight_dtype="bfloat16", amp="bf16", optim="adamw_torch_fused")
# (label, Workload changes, traceable)
SAVERS = [
    ("none", {}, True),
    ("chunked cross-entropy", {"loss_chunk_size": 1024}, True),
    ("gradient checkpointing", {"gradient_checkpointing": True}, True),
    ("checkpointing + chunked CE", {"gradient_checkpointing": True, "loss_chunk_size": 1024}, True),
    (
        "checkpointing + chunked CE + paged 8-bit AdamW",
        {"gradient_checkpointing": True, "loss_chunk_size": 1024, "optim": "paged_adamw_8bit"},
        True,
    ),
    ("Liger kernels (fused linear cross-entropy)", {"liger_kernel": True}, False),
    ("checkpointing + Liger kernels", {"gradient_checkpointing": True, "liger_kernel": True}, False),
    ("activation offloading", {"offload_activations": True}, False),
    ("activation offloading + chunked CE", {"offload_activations": True, "loss_chunk_size": 1024}, False),
]


def qlora(facts) -> Workload:
    targets = tuple(resolve_targets(facts, "all-linear", []))
    a = Adapters("qlora", 16, targets, lora_dropout=0.05, compute_dtype="bfloat16")
    return dataclasses.replace(FULL, weight_dtype="float32", adapters=a)


def cases(facts):
    for method, base in (("full", FULL), ("qlora", qlora(facts))):
        for seq in (2048, 8192):
            for label, change, traceable in SAVERS:
                yield method, seq, label, dataclasses.replace(base, seq_len=seq, **change), traceable


_DEFAULTS = Workload(per_device_batch=1, seq_len=1).to_dict()


def _key_of(d: dict) -> str:
    """The workload's fields that differ from Workload's defaults: new default-valued fields
    keep old cache entries valid."""
    return json.dumps({k: v for k, v in d.items() if k in ("per_device_batch", "seq_len") or v != _DEFAULTS.get(k)}, sort_keys=True)


def _key(wl: Workload) -> str:
    return _key_of(wl.to_dict())


def run(trace: bool) -> list[dict]:
    config = read_config(str(CONFIG))
    facts = model_facts(config, "causal-lm", 2)
    cache = {_key_of(json.loads(k)): v for k, v in (json.loads(CACHE.read_text()) if CACHE.exists() else {}).items()}
    rows = []
    for method, seq, label, wl, traceable in cases(facts):
        est = estimate_memory(facts, wl)
        row = {
            "method": method,
            "seq": seq,
            "savers": label,
            "plan": est.allocated_peak_bytes,
            "plan_logits": est.components["logits_loss"],
            "traced": None,
            "traced_logits": None,
            "traceable": traceable,
        }
        if trace and traceable:
            key = _key(wl)
            if key not in cache:
                from gpuplan.trace import trace_memory

                t0 = time.perf_counter()
                tr = trace_memory(config, wl)
                cache[key] = {"peak": tr.allocated_peak_bytes, "logits": tr.components["logits_loss"], "seconds": time.perf_counter() - t0}
                CACHE.write_text(json.dumps(cache))
                print(f"traced {method} {seq} {label}: {cache[key]['peak'] / GIB:.2f} GiB ({cache[key]['seconds']:.0f} s)", flush=True)
            row["traced"], row["traced_logits"] = cache[key]["peak"], cache[key]["logits"]
        rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "Llama-3.1-8B (specs/models/llama-3.1-8b.json), batch 1, allocated peak of one device "
        "(torch.cuda.max_memory_allocated). Plan = the analytic estimate `gpuplan plan` prints; "
        "traced = two real training steps under FakeTensorMode (gpuplan/trace). "
        "logits = the loss path's part at the peak (0: the peak is elsewhere, e.g. inside a layer's backward). "
        "Full: bf16 weights, bf16 autocast, fused AdamW. QLoRA: NF4 base, r 16 all-linear, bf16 autocast.",
        "",
        "| method | tokens | savers | plan GiB | plan logits GiB | traced GiB | traced logits GiB | plan vs trace |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tr = r["traced"]
        diff = (
            f"{(r['plan'] - tr) / tr:+.1%}"
            if tr
            else "not traced"
            if r["traceable"]
            else "analytic only: Liger's Triton kernels do not run on CPU"
            if "Liger" in r["savers"]
            else "analytic only: the trace cannot tell host from device tensors"
        )
        tl = f"{r['traced_logits'] / GIB:.2f}" if tr else "-"
        lines.append(
            f"| {r['method']} | {r['seq']:,} | {r['savers']} | {r['plan'] / GIB:.2f} | "
            f"{r['plan_logits'] / GIB:.2f} | {f'{tr / GIB:.2f}' if tr else '-'} | {tl} | {diff} |"
        )
    return "\n".join(lines)


PUBLISHED = ROOT / "benchmarks" / "data" / "published-memory.json"
# LitGPT's QLoRA rows with bitsandbytes' PagedAdamW (tutorials/resource-tables.md, lit-gpt 8641822):
# bf16-true (bf16 weights, no autocast), LoRA r 8 on query and value, micro-batch 1, Alpaca padded
# to its longest sample (1,304 tokens for Llama 2), measured as torch.cuda.max_memory_allocated.
# index -> (config, double quantization)
PAGED_ROWS = {242: ("llama-2-7b", False), 243: ("llama-2-7b", True), 247: ("llama-2-13b", False), 248: ("llama-2-13b", True)}


def published_paged() -> list[dict]:
    """The plan of each LitGPT paged-AdamW row: the states counted resident, and without them
    (what max_memory_allocated shows: unified memory is not torch's allocator's)."""
    data = json.loads(PUBLISHED.read_text())
    out = []
    for idx, (name, dq) in PAGED_ROWS.items():
        row = data[idx]
        facts = model_facts(read_config(str(ROOT / "specs" / "models" / f"{name}.json")), "causal-lm", 2)
        a = Adapters("qlora", 8, tuple(resolve_targets(facts, ["q_proj", "v_proj"], [])), double_quant=dq, compute_dtype="bfloat16")
        wl = Workload(
            per_device_batch=row["batch_size"],
            seq_len=row["seq_len"],
            weight_dtype="bfloat16",
            optim="paged_adamw_32bit",
            gradient_accumulation_steps=row["grad_accum"],
            adapters=a,
        )
        est = estimate_memory(facts, wl)
        # paged_adamw_32bit: two fp32 states per value, in unified memory for tensors >= 100,000 elements
        states = paged_bytes([s for _, s in adapter_layout(facts, a).adapter_shapes], 8)
        out.append(
            {
                "idx": idx,
                "detail": row["source_detail"],
                "seq": row["seq_len"],
                "published": row["value_gib"],
                "plan": est.allocated_peak_bytes / GIB,
                "unpaged": (est.allocated_peak_bytes - states) / GIB,
                "states": states / GIB,
            }
        )
    return out


def render_published(rows: list[dict]) -> str:
    lines = [
        "",
        "Published rows with a paged optimizer: LitGPT's QLoRA on an A100-40GB with bitsandbytes' PagedAdamW "
        "(benchmarks/data/published-memory.json, LitGPT tutorials/resource-tables.md): bf16 weights, no autocast, "
        "LoRA r 8 on q and v, batch 1, padded to the longest sample. `plan` counts the paged states as resident, "
        "`plan without paged states` is what torch.cuda.max_memory_allocated can show (managed memory is not "
        "torch's allocator's); with r 8 every LoRA matrix (8 x 4,096 or 4,096 x 8) is under bitsandbytes' "
        "100,000-element floor, so none is paged and paging changes nothing here. LitGPT runs its own "
        "model code and keeps the non-quantized parts in bf16 where peft's prepare_model_for_kbit_training "
        "(what gpuplan plans) upcasts them to fp32.",
        "",
        "| row | setup | seq | published GiB | plan GiB | paged states GiB | plan without paged states | vs published |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['idx']} | {r['detail']} | {r['seq']:,} | {r['published']:.2f} | {r['plan']:.2f} | "
            f"{r['states']:.3f} | {r['unpaged']:.2f} | {(r['unpaged'] - r['published']) / r['published']:+.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-trace", action="store_true", help="the analytic figures only")
    ap.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    ap.add_argument("--quick", action="store_true", help="CI: --no-trace --no-write (tracing the 8B model takes minutes)")
    args = ap.parse_args()
    if args.quick:
        args.no_trace = args.no_write = True
    body = render(run(trace=not args.no_trace)) + "\n" + render_published(published_paged())
    print(body)
    if not args.no_write:
        from results import write_section

        write_section("saver_memory", "The peak by memory saver (Llama-3.1-8B, 2,048 and 8,192 tokens)", body)


if __name__ == "__main__":
    main()
