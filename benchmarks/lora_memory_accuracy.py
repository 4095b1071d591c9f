"""LoRA / QLoRA: analytic vs traced memory over small models of 6 families (memory_accuracy.py's method).

Each case traces two real training steps of the real peft model under FakeTensorMode
(qlora: the real bitsandbytes 4-bit layers and quant states, gpuplan/trace/adapters.py)
and compares the analytic estimate (gpuplan/plan/estimate/memory/adapters.py). Ranks 8-64,
attention-only and all-linear targets, checkpointing on and off, bf16 autocast over
fp32 or bf16 weights or plain fp32, lora and qlora. Writes the `lora_memory_accuracy` section of
benchmarks/RESULTS.md.

    python benchmarks/lora_memory_accuracy.py [--no-write]
    python benchmarks/lora_memory_accuracy.py --quick   # CI: 2 of the cases (a lora and a qlora one), writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_accuracy import MODELS, precision_name  # noqa: E402

from gpuplan.modelinfo import model_facts  # noqa: E402
from gpuplan.modelinfo.lora_targets import resolve_targets  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.types import Adapters, Workload  # noqa: E402

FAMILIES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox", "opt")
ATTENTION = {"gpt2": ["c_attn"], "gpt_neox": ["query_key_value"], "bert": ["query", "value"]}
AMP = dict(weight_dtype="float32", amp="bf16")
HALF = dict(weight_dtype="bfloat16", amp=None)
FP32 = dict(weight_dtype="float32", amp=None)  # what a CPU plan runs
# (method, precision, r, targets, checkpointing, accumulation)
PATTERN = [
    ("lora", AMP, 8, "all-linear", False, 1),
    ("lora", AMP, 16, "attention", True, 1),
    ("lora", HALF, 32, "all-linear", False, 1),
    ("lora", HALF, 64, "attention", False, 1),
    ("lora", HALF, 16, "all-linear", True, 1),
    ("qlora", AMP, 16, "all-linear", False, 1),
    ("qlora", AMP, 64, "all-linear", True, 1),
    ("qlora", AMP, 8, "attention", False, 1),
    ("lora", AMP, 16, "all-linear", False, 2),
    ("lora", FP32, 16, "all-linear", False, 1),
    ("qlora", FP32, 32, "attention", True, 1),
]
SIZES = [(4, 512), (2, 1024), (8, 256), (1, 2048), (4, 256), (2, 512)]


def cases() -> list[tuple[str, Workload]]:
    out = []
    n = 0
    for fam in FAMILIES:
        facts = model_facts(MODELS[fam])
        for method, prec, r, targets, ckpt, accum in PATTERN:
            names = resolve_targets(facts, "all-linear" if targets == "all-linear" else ATTENTION.get(fam, ["q_proj", "v_proj"]), [])
            b, s = SIZES[n % len(SIZES)]
            out.append(
                (
                    fam,
                    Workload(
                        b,
                        s,
                        gradient_accumulation_steps=accum,
                        optim="adamw_torch_fused",
                        gradient_checkpointing=ckpt,
                        **prec,
                        adapters=Adapters(method=method, r=r, target_modules=tuple(names)),
                    ),
                )
            )
            n += 1
    return out


def run(quick: bool = False, write: bool = True) -> dict:
    from gpuplan.trace import trace_memory

    rows = []
    todo = cases()
    if quick:  # the first family's first lora and first qlora case (PATTERN rows 0 and 5)
        todo = [todo[0], todo[5]]
    t_all = time.perf_counter()
    for fam, wl in todo:
        cfg = MODELS[fam]
        facts = model_facts(cfg, wl.task)
        t0 = time.perf_counter()
        tr = trace_memory(cfg, wl).allocated_peak_bytes
        t_trace = time.perf_counter() - t0
        an = estimate_memory(facts, wl).allocated_peak_bytes
        a = wl.adapters
        rows.append(
            dict(
                family=fam,
                method=a.method,
                precision=precision_name(wl),
                r=a.r,
                targets="all-linear" if len(a.target_modules) > 2 else "attention",
                ckpt=wl.gradient_checkpointing,
                batch=wl.per_device_batch,
                seq=wl.seq_len,
                accum=wl.gradient_accumulation_steps,
                traced=tr,
                analytic=an,
                err=(an - tr) / tr,
            )
        )
        r = rows[-1]
        print(
            f"{fam:8s} {a.method:5s} {r['precision']:8s} r={a.r:<3d} {r['targets']:10s} ckpt={int(r['ckpt'])} "
            f"b={wl.per_device_batch:<2d} s={wl.seq_len:<5d} acc={r['accum']} traced {tr / 2**20:8.1f} MiB  "
            f"analytic {r['err']:+7.2%}  ({t_trace:.1f} s)",
            flush=True,
        )
    errs = [abs(r["err"]) for r in rows]
    summary = dict(cases=len(rows), median=statistics.median(errs), max=max(errs), wall_s=time.perf_counter() - t_all)
    print(f"{len(rows)} cases: analytic |error| median {summary['median']:.2%}, max {summary['max']:.2%}; {summary['wall_s']:.0f} s")
    if write:
        from results import write_section

        write_section("lora_memory_accuracy", "LoRA / QLoRA memory estimate accuracy (analytic vs traced)", render(rows, summary))
    return summary


def render(rows: list[dict], summary: dict) -> str:
    lines = [
        "Each case: tensor peak of two training steps of the real peft model traced under FakeTensorMode "
        "(qlora: real bitsandbytes 4-bit layers with their quant state) against the analytic estimate "
        "(gpuplan/plan/estimate/memory/adapters.py). Error = (analytic - traced) / traced. "
        "Target: median |error| <= 3%, max <= 10%. Precision amp-bf16 = fp32 weights under bf16 autocast "
        "(for qlora: the fp32 parts prepare_model_for_kbit_training leaves); bf16 = bf16 weights.",
        "",
        f"**{summary['cases']} cases. Analytic: median |error| {summary['median']:.2%}, max {summary['max']:.2%}.** "
        f"Whole benchmark: {summary['wall_s']:.0f} s on this machine.",
        "",
        "| family | method | precision | r | targets | ckpt | batch | seq | accum | traced MiB | analytic err |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['method']} | {r['precision']} | {r['r']} | {r['targets']} | "
            f"{'on' if r['ckpt'] else 'off'} | {r['batch']} | {r['seq']} | {r['accum']} | "
            f"{r['traced'] / 2**20:.1f} | {r['err']:+.2%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI: two cases only (a lora and a qlora one), RESULTS.md left alone")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    a = ap.parse_args()
    run(quick=a.quick, write=not (a.no_write or a.quick))
