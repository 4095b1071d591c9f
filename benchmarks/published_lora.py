"""The plan against the published LoRA / QLoRA memory figures the shipped model configs can express.

Rows of benchmarks/data/published-memory.json whose model has a config in specs/models/ and whose setup gpuplan can state as a
spec: each is priced by the analytic estimate (gpuplan.plan.estimate.memory.estimate_memory, the
numbers `gpuplan plan` prints) and compared with the published figure. Writes the
`published_lora` section of benchmarks/RESULTS.md, with the rows left out and why.

    python benchmarks/published_lora.py [--no-write]
    python benchmarks/published_lora.py --quick   # CI: the same rows (analytic, seconds), writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpuplan.modelinfo import model_facts, read_config  # noqa: E402
from gpuplan.modelinfo.lora_targets import resolve_targets  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.types import Adapters, Workload  # noqa: E402
from gpuplan.units import GIB  # noqa: E402

PUBLISHED = ROOT / "benchmarks" / "data" / "published-memory.json"
QV = ("q_proj", "v_proj")
ALL = "all-linear"
# index -> (config, method, r, targets, Workload fields, measure, note)
#   measure "allocated": torch.cuda.max_memory_allocated; "cap": the largest context that fits a VRAM cap
LITGPT = "LitGPT bf16-true: bf16 weights, no autocast; LitGPT's own model code"
LITGPT_Q = (
    LITGPT + "; its 4-bit base keeps the other parts in bf16 where peft's prepare_model_for_kbit_training (planned) upcasts them to fp32"
)
ROWS = {
    291: (
        "llama-3.1-8b",
        "lora",
        32,
        QV,
        dict(per_device_batch=1, gradient_accumulation_steps=8, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT,
    ),
    292: (
        "llama-3.1-8b",
        "qlora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT_Q,
    ),
    289: (
        "llama-3.1-8b",
        "lora",
        32,
        QV,
        dict(per_device_batch=1, gradient_accumulation_steps=8, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT + " (Llama-3-8B: the 3.1 config's shapes)",
    ),
    290: (
        "llama-3.1-8b",
        "qlora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT_Q,
    ),
    294: (
        "llama-3.2-1b",
        "lora",
        32,
        QV,
        dict(per_device_batch=1, gradient_accumulation_steps=8, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT,
    ),
    295: (
        "llama-3.2-1b",
        "qlora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT_Q,
    ),
    299: (
        "mistral-7b-v0.3",
        "lora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT + "; v0.3 config (vocab 32768 vs 32000)",
    ),
    301: (
        "mistral-7b-v0.3",
        "lora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT + "; v0.3 config (vocab 32768 vs 32000)",
    ),
    302: (
        "mistral-7b-v0.3",
        "qlora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT_Q + "; v0.3 config (vocab 32768 vs 32000)",
    ),
    300: (
        "mistral-7b-v0.3",
        "qlora",
        32,
        QV,
        dict(per_device_batch=2, gradient_accumulation_steps=4, seq_len=512, weight_dtype="bfloat16"),
        "allocated",
        LITGPT_Q + "; v0.3 config (vocab 32768 vs 32000)",
    ),
}
UNSLOTH = "HF+PEFT+FA2 baseline: largest context that fits the cap (reserved memory vs cap); bf16 AMP, checkpointing, 8-bit AdamW assumed"
for idx, seq in ((33, 932), (34, 2551), (35, 5789), (36, 12264), (37, 15502), (38, 28454)):
    ROWS[idx] = (
        "llama-3.1-8b",
        "qlora",
        32,
        ALL,
        dict(
            per_device_batch=1,
            seq_len=seq,
            amp="bf16",
            gradient_checkpointing=True,
            optim="adamw_8bit",
            attn_implementation="flash_attention_2",
        ),
        "cap",
        UNSLOTH,
    )
ROWS[39] = (
    "llama-3.1-70b",
    "qlora",
    32,
    ALL,
    dict(
        per_device_batch=1,
        seq_len=6916,
        amp="bf16",
        gradient_checkpointing=True,
        optim="adamw_8bit",
        attn_implementation="flash_attention_2",
    ),
    "cap",
    UNSLOTH + " (Llama-3.3-70B: the 3.1-70B config's shapes)",
)
LEFT_OUT = [
    (
        "every row of Llama-2 (7B, 13B, 70B), CodeLlama-34B, Llama-3.2-3B, Qwen-1 (1.8B-72B, incl. Int4), ChatGLM3, "
        "Yi, Baichuan2, OpenBuddy-Zephyr, BLOOMZ / mT0 / T0, Falcon, phi-1.5, StableLM-alpha, TinyLlama",
        "no config for the model in specs/models/",
    ),
    ("18, 19 (Mistral-7B QLoRA, unsloth's HF baseline)", "batch size and sequence count not stated"),
    (
        "277-284, 304-308 (Gemma, Gemma-2, Phi-2, Phi-3-mini, LitGPT)",
        "LitGPT's `lora_head` puts an adapter on the LM head; gpuplan plans LoRA on the layers peft's all-linear "
        "takes (the head excluded); Gemma-2-9B also has no shipped config",
    ),
    ("330, 331 (Mistral-7B QLoRA on 2 x RTX-4090, fsdp_qlora)", "sharded: in the fsdp_adapters section (benchmarks/fsdp_adapters.py)"),
    (
        "209, 210, 212-216, 251-262, 332-335",
        "DoRA-only / AdaLoRA / GaLore / LISA / LLaMA-Pro / LLaMA-Adapter / "
        "unspecified fine-tunes: not LoRA or QLoRA as peft's LoraConfig states it",
    ),
]


def run(write: bool = True) -> list[dict]:
    data = json.loads(PUBLISHED.read_text())
    out = []
    for idx, (cfg_name, method, r, targets, fields, measure, note) in sorted(ROWS.items()):
        row = data[idx]
        facts = model_facts(read_config(ROOT / "specs" / "models" / f"{cfg_name}.json"))
        names = tuple(resolve_targets(facts, targets if targets == ALL else list(targets), []))
        wl = Workload(**{"optim": "adamw_torch", **fields}, adapters=Adapters(method=method, r=r, target_modules=names))
        est = estimate_memory(facts, wl)
        value = row["value_gib"]
        ours = (est.allocated_peak_bytes if measure == "allocated" else est.reserved_peak_bytes) / GIB
        out.append(
            dict(
                idx=idx,
                model=row["model"].split(" ")[0],
                method=method,
                r=r,
                targets="q,v" if targets == QV else "all-linear",
                gpu=row["gpu"],
                batch=wl.per_device_batch,
                seq=wl.seq_len,
                measure=measure,
                published=value,
                ours=ours,
                err=(ours - value) / value,
                note=note,
            )
        )
        print(
            f"{idx:4d} {out[-1]['model']:36s} {method:5s} r={r:<3d} s={wl.seq_len:<6d} published {value:6.2f} GiB  "
            f"plan {ours:6.2f} GiB  {out[-1]['err']:+.1%}"
        )
    if write:
        from results import write_section

        write_section("published_lora", "LoRA / QLoRA: the plan against published figures", render(out))
    return out


def render(rows: list[dict]) -> str:
    lines = [
        "Rows of `benchmarks/data/published-memory.json` with method LoRA or QLoRA whose model has a shipped config "
        "(specs/models/), priced by the analytic estimate. `allocated` rows compare "
        "torch.cuda.max_memory_allocated with the plan's allocated peak; `cap` rows are the largest context "
        "that fit a VRAM cap, compared with the plan's device total (nvidia-smi) at that context: near 0% "
        "or below means the plan agrees the run fits that cap.",
        "",
        "| row | model | method | r | targets | GPU | batch | seq | measure | published GiB | plan GiB | plan vs published | setup |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['idx']} | {r['model']} | {r['method']} | {r['r']} | {r['targets']} | {r['gpu']} | {r['batch']} | "
            f"{r['seq']} | {r['measure']} | {r['published']:.2f} | {r['ours']:.2f} | {r['err']:+.1%} | {r['note']} |"
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
