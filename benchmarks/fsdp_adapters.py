"""The plan against the published memory of LoRA / QLoRA under FSDP FULL_SHARD, with and without CPU offload.

Rows of benchmarks/data/published-memory.json from Answer.AI's fsdp_qlora benchmarks
(benchmarks_03_2024.md: torch.cuda.max_memory_reserved per GPU) and peft's FSDP guide
(huggingface/peft:docs/source/accelerate/fsdp.md: "memory consumed per GPU", its metric not stated), each priced
by the analytic estimate the plan prints (gpuplan.plan.estimate.memory.estimate_memory with the
Workload of the plan's fit: FSDP2 units, the frozen base sharded, memory/adapters_sharded.py)
at the published setup, on the configs in specs/models/. Writes the `fsdp_adapters` section of
benchmarks/RESULTS.md with the median absolute error and the rows left out.

    python benchmarks/fsdp_adapters.py [--no-write]
    python benchmarks/fsdp_adapters.py --quick   # CI: the same rows (analytic, seconds), writes nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpuplan.hardware.catalog import lookup  # noqa: E402
from gpuplan.modelinfo import model_facts, read_config  # noqa: E402
from gpuplan.modelinfo.lora_targets import resolve_targets  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.types import Adapters, Workload  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "data" / "published-memory.json"
GIB = 1024**3
ANSWERAI = (
    "fsdp_qlora train.py, precision bf16 (pure bf16: bf16 LoRA and Adam states, a bf16 rest); planned as peft "
    "+ accelerate do it: fp32 adapters, fp32 rest (prepare_model_for_kbit_training)"
)
PEFT = "peft's FSDP guide (TRL SFTTrainer, accelerate FSDP, bf16 AMP, quant storage bf16, FA2)"
# index -> (config, GPU, fields of the Workload, measure, note); method, r, batch and seq from the row
ROWS: dict[int, tuple[str, str, dict, str, str]] = {}
for idx in (315, 316, 317, 318, 319, 320, 321, 322):
    ROWS[idx] = ("llama-2-7b", "RTX-3090", {}, "reserved", ANSWERAI)
for idx in (328, 329):
    ROWS[idx] = ("llama-2-7b", "RTX-4090", {"offload": True}, "reserved", ANSWERAI)
ROWS[325] = ("yi-34b", "RTX-3090", {}, "reserved", ANSWERAI)
ROWS[326] = ("yi-34b", "RTX-3090", {"offload": True}, "reserved", ANSWERAI)
ROWS[327] = ("llama-2-70b", "RTX-3090", {"offload": True}, "reserved", ANSWERAI)
for idx in (330, 331):
    ROWS[idx] = ("mistral-7b-v0.3", "RTX-4090", {"offload": True}, "reserved", ANSWERAI + "; the v0.3 config (vocab 32768 vs v0.2's 32000)")
ROWS[229] = (
    "llama-2-70b",
    "RTX-4090",
    {"offload": True, "amp": "bf16", "attn": "flash_attention_2"},
    "reserved",
    PEFT + "; '24GB-class GPU'",
)
ROWS[230] = ("llama-2-70b", "A100-80GB", {"amp": "bf16", "attn": "flash_attention_2"}, "reserved", PEFT + "; GPU not stated")
ROWS[228] = (
    "llama-2-70b",
    "H100-80GB",
    {"amp": "bf16", "attn": "flash_attention_2"},
    "reserved",
    PEFT + "; nvidia-smi 72-80 GB, the midpoint",
)
LEFT_OUT = [
    ("323, 324 (fsdp_qlora 'FSDP in DDP mode')", "no sharding: not the FULL_SHARD rows this section checks"),
]


def workload(row: dict, facts, extra: dict) -> Workload:
    method = "qlora" if row["method"].lower() == "qlora" else "lora"
    names = tuple(resolve_targets(facts, "all-linear", []))
    offload = extra.get("offload", False)
    return Workload(
        per_device_batch=int(row["batch_size"]),
        seq_len=int(row["seq_len"]),
        gradient_accumulation_steps=int(row["grad_accum"] or 1),
        weight_dtype="bfloat16",
        amp=extra.get("amp"),
        optim="adamw_torch",
        gradient_checkpointing=bool(row["activation_checkpointing"]),
        attn_implementation=extra.get("attn", "sdpa"),
        engine="fsdp",
        zero_stage=3,
        shard_world_size=int(row["num_gpus"]),
        offload_params=offload,
        offload_optimizer=offload,
        adapters=Adapters(method=method, r=int(row["lora_rank"]), target_modules=names),
    )


def run(write: bool = True) -> list[dict]:
    data = json.loads(PUBLISHED.read_text())
    out = []
    for idx, (cfg, gpu_name, extra, measure, note) in sorted(ROWS.items()):
        row = data[idx]
        facts = model_facts(read_config(ROOT / "specs" / "models" / f"{cfg}.json"))
        wl = workload(row, facts, extra)
        est = estimate_memory(facts, wl, lookup(gpu_name, None))
        ours = (est.reserved_peak_bytes if measure == "reserved" else est.allocated_peak_bytes) / GIB
        value = row["value_gib"]
        if not est.components["activations"]:  # the peak is the load, before training starts
            note += (
                "; the plan's peak is loading the whole 4-bit base onto each GPU before fully_shard (apply's "
                "device_map path without offload), above its training peak"
            )
        out.append(
            dict(
                idx=idx,
                model=row["model"].split(" ")[0],
                method=wl.adapters.method,
                r=wl.adapters.r,
                gpu=row["gpu"],
                batch=wl.per_device_batch,
                seq=wl.seq_len,
                offload=wl.offload_params,
                published=value,
                ours=ours,
                host=est.host_bytes / GIB,
                err=(ours - value) / value,
                note=note,
            )
        )
        print(
            f"{idx:4d} {out[-1]['model']:30s} {wl.adapters.method:5s} b={wl.per_device_batch:<3d} s={wl.seq_len:<6d} "
            f"offload={str(wl.offload_params):5s} published {value:6.2f}  plan {ours:6.2f} GiB  {out[-1]['err']:+.1%}"
        )
    med = statistics.median(abs(r["err"]) for r in out)
    print(f"median |error| {med:.1%} over {len(out)} rows")
    if write:
        from results import write_section

        write_section("fsdp_adapters", "LoRA / QLoRA under FSDP FULL_SHARD: the plan against published figures", render(out, med))
    return out


def render(rows: list[dict], med: float) -> str:
    lines = [
        "Rows of `benchmarks/data/published-memory.json` for LoRA / QLoRA under FSDP FULL_SHARD, with and without CPU "
        "offload, priced by the analytic estimate (memory/adapters_sharded.py) at the published setup; all-linear "
        "targets, gradient checkpointing as published. The plan's device total (nvidia-smi, reserved) against the "
        f"published per-GPU figure. **Median absolute error {med:.1%} over {len(rows)} rows.**",
        "",
        "| row | model | method | r | GPU | batch | seq | CPU offload | published GiB | plan GiB | plan vs published | "
        "plan host RAM per GPU GiB | setup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['idx']} | {r['model']} | {r['method']} | {r['r']} | {r['gpu']} | {r['batch']} | {r['seq']} | "
            f"{'yes' if r['offload'] else 'no'} | {r['published']:.2f} | {r['ours']:.2f} | {r['err']:+.1%} | "
            f"{r['host']:.1f} | {r['note']} |"
        )
    lines += ["", "Left out:", ""]
    lines += [f"- {rows_}: {why}." for rows_, why in LEFT_OUT]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CI: the same rows (they take seconds), RESULTS.md left alone")
    a = ap.parse_args()
    run(write=not (a.no_write or a.quick))
