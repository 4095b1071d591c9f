"""DPO / KTO step memory: the analytic estimate (gpuplan/plan/estimate/memory/preference.py) against the
fake-tensor trace of the real step (gpuplan/trace/preference.py: TRL 1.16's fused log-prob head,
the reference forward, the loss, backward, the optimizer), CUDA plans, two Llama sizes.

    python benchmarks/preference_memory_accuracy.py           # ~2 min on one CPU core
    python benchmarks/preference_memory_accuracy.py --quick   # CI: the small model, one DPO case

Prints one row per case and the median / max absolute error; results in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import statistics
import warnings

warnings.filterwarnings("ignore")

from gpuplan.modelinfo import model_facts  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.types import Adapters, Workload  # noqa: E402
from gpuplan.trace import trace_memory  # noqa: E402

SMALL = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=8000,
)
WIDER = dict(SMALL, hidden_size=384, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=6, vocab_size=32000)
LORA = Adapters(method="lora", r=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
BASES = [
    Workload(2, 512, amp="bf16", objective="dpo", reference="copy"),
    Workload(2, 512, weight_dtype="bfloat16", objective="dpo", reference="copy"),
    Workload(2, 512, weight_dtype="bfloat16", objective="dpo", reference="copy", gradient_checkpointing=True),
    Workload(2, 256, objective="dpo", reference="copy"),
    Workload(1, 1024, amp="bf16", objective="dpo", reference="precomputed", gradient_checkpointing=True),
    Workload(2, 512, amp="bf16", objective="dpo", reference="adapters-off", adapters=LORA),
    Workload(2, 512, amp="bf16", objective="dpo", reference="adapters-off", adapters=LORA, gradient_checkpointing=True),
    Workload(2, 256, amp="bf16", objective="kto", reference="copy"),
    Workload(2, 256, amp="bf16", objective="dpo", reference="copy", gradient_accumulation_steps=2),
]


def main(quick: bool = False) -> None:
    errors = []
    for name, cfg in (("small", SMALL),) if quick else (("small", SMALL), ("wider", WIDER)):
        facts = model_facts(cfg, "causal-lm", 2)
        for wl in [BASES[3]] if quick else BASES:
            wl = dataclasses.replace(wl)
            t = trace_memory(cfg, wl)
            a = estimate_memory(facts, wl)
            err = a.allocated_peak_bytes / t.allocated_peak_bytes - 1
            errors.append(abs(err))
            label = (
                f"{name} {wl.objective} ref={wl.reference} {wl.weight_dtype}/{wl.amp or '-'} b={wl.per_device_batch}"
                f" s={wl.seq_len} ck={int(wl.gradient_checkpointing)} acc={wl.gradient_accumulation_steps}"
                f" {'lora' if wl.adapters else 'full'}"
            )
            print(
                f"{label:<78} traced {t.allocated_peak_bytes / 2**20:8.1f} MiB  analytic "
                f"{a.allocated_peak_bytes / 2**20:8.1f} MiB  {err:+.2%}",
                flush=True,
            )
    print(f"{len(errors)} cases: median |error| {statistics.median(errors):.2%}, max {max(errors):.2%}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI: the small model, one DPO case")
    main(quick=ap.parse_args().quick)
