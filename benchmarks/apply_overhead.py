"""What does `gpuplan apply` cost over a hand-written Trainer script? (target: throughput >= 0.97)

The same tiny training (specs/models/tiny-llama-cpu.json from scratch on
specs/data/tiny-corpus.txt, CPU) runs through execute(plan), the plan made from a spec by
plan_file as `gpuplan apply` makes it, and through a hand-written script using identical
TrainingArguments (checked against the plan's), each in a fresh process, alternating
A/B/A/B so machine load drifts hit both. Measured per run:
- steady throughput: tokens/s over the optimizer steps after the first (same
  on_step_end timing in both);
- time to first step: from process start (before importing torch) to the end of the
  first optimizer step, including imports, model build and data preparation.

    python benchmarks/apply_overhead.py [--runs 3] [--steps 60] [--no-write]
    python benchmarks/apply_overhead.py --quick   # CI: one run of each, 3 steps, writes nothing
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # process start, before heavy imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "specs" / "models" / "tiny-llama-cpu.json"
CORPUS = REPO / "specs" / "data" / "tiny-corpus.txt"
SEQ_LEN, BATCH, LR = 128, 16, 3e-3


def bench_spec(out_dir: str, steps: int) -> str:
    """The spec a user would write for this run (TOML text); paths are absolute so it can live anywhere."""
    return f"""[model]
config = {json.dumps(str(CONFIG))}
from_scratch = true
task = "causal-lm"
dtype = "float32"
attn_implementation = "sdpa"

[hardware]
gpu = "cpu"

[data]
train_files = [{json.dumps(str(CORPUS))}]
eval_fraction = 0.0
seq_len = {SEQ_LEN}
packing = true

[training]
effective_batch_size = {BATCH}
per_device_train_batch_size = {BATCH}
gradient_checkpointing = false
optim = "adamw_torch_fused"
learning_rate = {LR}
max_steps = {steps}
num_train_epochs = 1.0
lr_scheduler_type = "cosine"
warmup_steps = 5
weight_decay = 0.0
max_grad_norm = 1.0
logging_steps = 10
save_steps = 10000
save_total_limit = 1
seed = 0
run_name = "apply-overhead"

[output]
dir = {json.dumps(out_dir)}
"""


def bench_plan(out_dir: str, steps: int):
    """The Plan of bench_spec() through the planner, as `gpuplan apply` makes it."""
    from gpuplan.plan.build import plan_file
    from gpuplan.plan.inputs.environment import local_environment

    spec = Path(out_dir).parent / "spec.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(bench_spec(out_dir, steps), encoding="utf-8")
    return plan_file(spec, environment=local_environment())


def run_gpuplan(out_dir: str, steps: int) -> dict:
    from gpuplan.apply.train.execute import execute

    plan = bench_plan(out_dir, steps)  # before the clock below: planning counts toward the first step, as in `gpuplan apply`
    called = time.perf_counter()
    r = execute(plan, echo=lambda s: None, progress=False)
    # time_to_first_step_s counts from the start of execute(); shift it to process start
    return {
        "steady_tokens_per_second": r["steady_tokens_per_second"],
        "time_to_first_step_s": r["time_to_first_step_s"] + (called - T0),
        "loss_last": r["train_loss_last"],
    }


def run_hand_written(out_dir: str, steps: int) -> dict:
    """What a person writes by hand: bytes in, 128-token blocks, a Llama config, Trainer."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    class StepTimer(TrainerCallback):  # the same on_step_end timing as gpuplan's MetricsCallback
        def __init__(self):
            self.first = self.last = None
            self.steps, self.time = 0, 0.0

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            if self.first is None:
                self.first = now - T0
            else:
                self.steps, self.time = self.steps + 1, self.time + now - self.last
            self.last = now

    args = dict(
        output_dir=out_dir,
        use_cpu=True,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=1,
        activation_checkpointing=False,
        torch_empty_cache_steps=None,
        use_liger_kernel=False,
        bf16=False,
        fp16=False,
        tf32=False,
        optim="adamw_torch_fused",
        learning_rate=LR,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        max_steps=steps,
        num_train_epochs=1.0,
        seed=0,
        dataloader_pin_memory=False,
        dataloader_num_workers=0,
        torch_compile=False,
        torch_compile_backend=None,
        torch_compile_mode=None,
        logging_steps=10,
        logging_first_step=True,
        save_steps=10_000,
        save_total_limit=1,
        eval_strategy="no",
        eval_steps=None,
        report_to="none",
        run_name="apply-overhead",
        disable_tqdm=True,
    )
    set_seed(0)
    tok = byte_level_tokenizer()
    ids: list[int] = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            ids += list(line.encode("utf-8")) + [tok.eos_token_id]
    blocks = [{"input_ids": ids[i : i + SEQ_LEN]} for i in range(0, len(ids) - SEQ_LEN + 1, SEQ_LEN)]
    cfg = json.loads(CONFIG.read_text())
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    timer = StepTimer()
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**args),
        train_dataset=blocks,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
        processing_class=tok,
        callbacks=[timer],
    )
    out = trainer.train()
    from gpuplan.apply.train.arguments import training_arguments_kwargs  # checked after the timed run: planning is not the hand path's cost

    assert args == training_arguments_kwargs(bench_plan(out_dir, steps), progress=False), "arguments drifted"
    tps = timer.steps * BATCH * SEQ_LEN / timer.time if timer.time else None
    return {"steady_tokens_per_second": tps, "time_to_first_step_s": timer.first, "loss_last": out.training_loss}


def one(kind: str, steps: int) -> None:
    with tempfile.TemporaryDirectory(prefix=f"apply-overhead-{kind}-") as d:
        result = (run_gpuplan if kind == "gpuplan" else run_hand_written)(os.path.join(d, "run"), steps)
    print("RESULT " + json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of each kind (alternating)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--quick", action="store_true", help="CI: one run of each path, 3 steps, RESULTS.md left alone")
    ap.add_argument("--one", choices=["gpuplan", "hand"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.runs, a.steps, a.no_write = 1, 3, True
    if a.one:
        return one(a.one, a.steps)
    # the caller's own environment, offline: no variable of its own, so that under tests/test_benchmarks.py the
    # worker's fork server serves both runs (a TRANSFORMERS_VERBOSITY set here made each a fresh interpreter, read at import)
    env = {"HF_HUB_OFFLINE": "1", **os.environ}
    load_before = os.getloadavg()[0]
    results: dict[str, list[dict]] = {"gpuplan": [], "hand": []}
    for i in range(a.runs):
        for kind in ("gpuplan", "hand") if i % 2 == 0 else ("hand", "gpuplan"):
            p = subprocess.run(
                [sys.executable, __file__, "--one", kind, "--steps", str(a.steps)], env=env, capture_output=True, text=True, cwd=REPO
            )
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                sys.exit(f"{kind} run failed:\n{p.stderr[-3000:]}")
            results[kind].append(json.loads(line[-1][7:]))
            r = results[kind][-1]
            print(f"{kind:8s} {r['steady_tokens_per_second']:9,.0f} tokens/s  first step {r['time_to_first_step_s']:.2f} s", flush=True)
    med = {
        k: {m: statistics.median(r[m] for r in v) for m in ("steady_tokens_per_second", "time_to_first_step_s")} for k, v in results.items()
    }
    thr = med["gpuplan"]["steady_tokens_per_second"] / med["hand"]["steady_tokens_per_second"]
    ttfs = med["gpuplan"]["time_to_first_step_s"] / med["hand"]["time_to_first_step_s"]
    print(f"throughput ratio gpuplan/hand {thr:.3f} (target >= 0.97); time-to-first-step ratio {ttfs:.3f}")

    lo = {k: min(r["steady_tokens_per_second"] for r in v) for k, v in results.items()}
    hi = {k: max(r["steady_tokens_per_second"] for r in v) for k, v in results.items()}
    noisy = max(hi[k] / lo[k] for k in hi) > 1.2  # a path varying by >20% run to run: the machine is busy
    load = f"1-minute load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} CPUs"
    noise = (
        f"\n\nToo noisy to measure ({load}): one path's runs differ by more than 20%, more than the"
        " difference between the paths. Rerun on a quiet machine."
        if noisy
        else f"\n\nMachine: {load}."
    )
    rows = "\n".join(
        f"| {k} | {med[k]['steady_tokens_per_second']:,.0f} | "
        f"{min(r['steady_tokens_per_second'] for r in results[k]):,.0f}-"
        f"{max(r['steady_tokens_per_second'] for r in results[k]):,.0f} | "
        f"{med[k]['time_to_first_step_s']:.2f} |"
        for k in ("gpuplan", "hand")
    )
    body = f"""Tiny Llama (specs/models/tiny-llama-cpu.json) from scratch on specs/data/tiny-corpus.txt, CPU,
seq_len {SEQ_LEN}, batch {BATCH}, {a.steps} steps, adamw_torch_fused; {a.runs} fresh-process runs of each,
alternating. Throughput is over the steps after the first; time to first step counts from process start
(imports, model build, data preparation). Python {sys.version.split()[0]}, {os.cpu_count()} CPUs (shared).

| path | median tokens/s | range | median time to first step (s) |
|---|---|---|---|
{rows}

Throughput ratio gpuplan/hand: **{thr:.3f}** (target >= 0.97). Time-to-first-step ratio: **{ttfs:.3f}**.{noise}"""
    if a.no_write:
        print(body)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import write_section

    write_section("apply_overhead", "Apply overhead", body)


if __name__ == "__main__":
    main()
