"""Host time of DeepSpeed ZeRO per parameter tensor, measured on this machine with a real DeepSpeed engine.

The step-time model prices DeepSpeed's Python hooks as host work per parameter tensor
(plan/estimate/step_time/terms.py fixed_terms):
- ZeRO-3 (`ZERO3_HOOK_S`, per parameter tensor per pass: forward, backward and, under
  checkpointing, the recomputed forward): each module's pre/post-forward and backward hooks
  fetch, release and re-partition its parameters (deepspeed/runtime/zero/parameter_offload.py,
  partitioned_param_coordinator.py), and each gradient is reduced and partitioned
  (stage3.py reduce_partition_and_remove_grads);
- ZeRO-2 (`ZERO2_HOOK_S`, per trainable tensor per micro-batch): the backward hook of each
  trainable parameter copies its gradient into the reduce bucket (stage_1_and_2.py
  reduce_ready_partitions_and_remove_grads). Stage 1's hook copies nothing and its per-tensor reduce
  runs once per step at the accumulation boundary (reduce_gradients); the micro-batches timed here are
  inside the window, so stage 1 is not measured and the model does not price it.
The published rows that depend on them are the Qwen README's DeepSpeed runs only: a fold of
benchmarks/fit_step_time.py that leaves Qwen out has nothing to fit ZERO3_HOOK_S on and uses its
prior, and no row tells ZeRO-2's apart from the rest. This script measures both.

How: a tiny LlamaForCausalLM (hidden 64, 16 tokens: the device work of every op is a few
microseconds) with 8 and with 4 decoder layers runs forward and backward (a micro-batch inside
an accumulation window: engine.backward, engine.step) under deepspeed.initialize with ZeRO
stage 2 and 3 on one process (the gloo backend, DS_ACCELERATOR=cpu), and the same models run
plain, alternating, full and LoRA (r 16 on every linear), with and without reentrant gradient
checkpointing. Host seconds of ZeRO per layer = ((z8 - z4) - (p8 - p4)) / 4, divided by the
tensors the model counts per layer (shape.py: 9 parameter tensors of a Llama layer, plus 2 per
LoRA adapter; the trainable ones for stage 2). The ZeRO config is what gpuplan apply
writes (apply/train/arguments.py: {"stage": N}, DeepSpeed's defaults otherwise) with one change:
stage3_param_persistence_threshold = 10 x hidden, so the tiny model partitions what a large one
partitions under the default 1e5 (the linears and r-64 adapters, not the norms), as HF's "auto"
does (transformers integrations/deepspeed.py).

DeepSpeed is not a dependency of gpuplan (its planner reads whether it is installed), so install it
beside, not into, the environment: `pip install --target DIR --no-deps deepspeed hjson ninja py-cpuinfo
einops` and run with PYTHONPATH=DIR (.ci/run does that; tests/test_benchmarks.py passes it on).
As with benchmarks/host_overhead.py, taking a CPU's host cost for a GPU host's is an assumption:
these are priors, and ZERO3_HOOK_S stays a fitted constant.

    PYTHONPATH=DIR python benchmarks/zero_overhead.py [--repeats 40] [--no-write]
    PYTHONPATH=DIR python benchmarks/zero_overhead.py --quick   # CI: stage 2 and 3, full, few repeats, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_overhead  # noqa: E402
from host_overhead import HIDDEN, TOKENS  # noqa: E402
from results import write_section  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "zero_overhead.json"
RANK = 16  # LoRA rank: r x hidden above the persistence threshold, as r 64 on a 4,096-wide model is above 1e5
CONFIGS = ((False, False), (False, True), (True, False), (True, True))  # (lora, checkpointing)


def _model(layers: int, lora: bool, ckpt: bool):
    return host_overhead._model(layers, lora, ckpt, rank=RANK)


def _tensors_per_layer(lora: bool) -> tuple[int, int]:
    """(the parameter tensors the step-time model counts per layer, the trainable ones) for this tiny model."""
    s8, s4 = (host_overhead._shape(n, lora, False, rank=RANK) for n in (8, 4))
    return (s8.zero3_tensors - s4.zero3_tensors) // 4, (s8.trainable_tensors - s4.trainable_tensors) // 4


def _engine(model, stage: int):
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 10**6,  # every timed micro-batch is inside the window: no optimizer step
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 10 * HIDDEN},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=config)
    engine.train()
    return engine


def measure(stage: int, lora: bool, ckpt: bool, repeats: int) -> dict:
    import torch

    ids = torch.randint(0, 128, (1, TOKENS))
    runs = {}
    for n in (4, 8):
        plain = _model(n, lora, ckpt)
        runs[("plain", n)] = lambda m=plain: m(input_ids=ids, labels=ids).loss.backward()
        engine = _engine(_model(n, lora, ckpt), stage)

        def zero(e=engine) -> None:
            e.backward(e(input_ids=ids, labels=ids).loss)
            e.step()

        runs[("zero", n)] = zero
    times: dict = {k: [] for k in runs}
    for i in range(repeats + 5):
        for k, f in runs.items():
            t = time.perf_counter()
            f()
            if i >= 5:  # the first passes warm the allocator, autograd's and DeepSpeed's caches
                times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = ((med[("zero", 8)] - med[("zero", 4)]) - (med[("plain", 8)] - med[("plain", 4)])) / 4
    counted, trainable = _tensors_per_layer(lora)
    passes = 3 if ckpt else 2
    per = extra / (counted * passes) if stage == 3 else extra / trainable
    row = {
        "stage": stage,
        "method": "lora" if lora else "full",
        "checkpointing": ckpt,
        "zero_host_ms_per_layer": round(extra * 1e3, 3),
        "tensors_per_layer": counted if stage == 3 else trainable,
        "passes": passes if stage == 3 else 1,
        "us_per_tensor": round(per * 1e6, 1),
    }
    unit = f"{counted} tensors x {passes} passes" if stage == 3 else f"{trainable} trainable tensors"
    print(
        f"ZeRO-{stage} {row['method']:4} ckpt={ckpt!s:5} {extra * 1e3:6.3f} ms per layer / {unit} = {row['us_per_tensor']:.1f} us",
        flush=True,
    )
    return row


def _single_process() -> None:
    """One rank over gloo on this host, on a free port of its own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=40, help="timed micro-batches per model")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CI: stages 2 and 3, full fine-tune, 6 repeats, writes nothing")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.no_write = 6, True
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before the import: DeepSpeed picks its accelerator then
    # `import deepspeed` imports mlflow (deepspeed/autotuning), whose telemetry writes ~/.config/mlflow: off
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        import deepspeed
    except ImportError:
        print(
            "deepspeed is not importable here: pip install --target DIR --no-deps deepspeed hjson ninja py-cpuinfo einops, "
            "then run with PYTHONPATH=DIR (outside the environment gpuplan plans in: its planner reads whether DeepSpeed is installed)",
            file=sys.stderr,
        )
        return 1
    _single_process()
    import logging
    import platform

    import torch
    import transformers

    torch.set_num_threads(1)  # host work is one thread
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    # DeepSpeed's CPU backend compiles a shared-memory all-reduce (op_builder/cpu ShareMemCommBuilder: a C++ build into
    # ~/.cache/torch_extensions) when it starts; with one rank no collective crosses processes, so it is left unbuilt
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    plan = [(2, False, False), (3, False, False)] if args.quick else [(st, lo, ck) for st in (2, 3) for lo, ck in CONFIGS]
    rows = [measure(st, lo, ck, args.repeats) for st, lo, ck in plan]
    by = {st: statistics.median(r["us_per_tensor"] for r in rows if r["stage"] == st) for st in sorted({r["stage"] for r in rows})}
    print("ZeRO host seconds per tensor (median): " + "; ".join(f"stage {st} {us:.1f} us" for st, us in by.items()))
    torch.distributed.destroy_process_group()
    if args.no_write:
        return 0
    # A difference of differences of timings: on a loaded machine it can come out at or below zero (seen: a quick run's
    # stage 2 at -162 us while the suite ran beside it). The plan would take it as a cost, so it is not written.
    if bad := host_overhead.unresolved({f"zero{st}_hook_s": round(us * 1e-6, 7) for st, us in by.items()}):
        print(
            f"not written: {bad} measured no cost above the plain model's noise; rerun on a quiet machine (or with more --repeats)",
            file=sys.stderr,
        )
        return 1
    machine = (
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"deepspeed {deepspeed.__version__}, one thread"
    )
    result = {
        "what": "DeepSpeed ZeRO host seconds per parameter tensor (stage 3: per counted tensor per pass; stage 2: per "
        "trainable tensor per micro-batch), measured by benchmarks/zero_overhead.py",
        "machine": machine,
        "zero3_hook_s": round(by[3] * 1e-6, 7),
        "zero2_hook_s": round(by[2] * 1e-6, 7),
        "rows": rows,
    }
    DATA.write_text(json.dumps(result, indent=2) + "\n")
    table = ["| stage | method | checkpointing | ZeRO host ms per layer | tensors per layer (the model's count) | passes | us per tensor |"]
    table.append("|---|---|---|---|---|---|---|")
    for r in rows:
        ck = "yes" if r["checkpointing"] else "no"
        table.append(
            f"| {r['stage']} | {r['method']} | {ck} | {r['zero_host_ms_per_layer']:.2f} | {r['tensors_per_layer']} | {r['passes']} | "
            f"{r['us_per_tensor']:.1f} |"
        )
    body = "\n".join(
        [
            f"{machine}. A real DeepSpeed engine on one gloo rank (DS_ACCELERATOR=cpu) against the plain model: forward and "
            f"backward of a tiny Llama (hidden {HIDDEN}, {TOKENS} tokens) with 8 and 4 decoder layers, {args.repeats} micro-batches "
            "each, alternating; ZeRO's host time per layer over the tensors the step-time model counts for it "
            "(benchmarks/data/zero_overhead.json). Stage 3 counts every parameter tensor (LoRA's adapters included) per pass, "
            "stage 2 the trainable tensors per micro-batch (stage 1 reduces once per step, at the accumulation boundary, which "
            "these micro-batches never reach: not measured, not priced):",
            "",
            *table,
            "",
            f"Medians: **stage 3 {by[3]:.0f} us per tensor per pass**, the prior of `ZERO3_HOOK_S` in "
            f"benchmarks/fit_step_time.py; **stage 2 {by[2]:.0f} us per trainable tensor per micro-batch**, `ZERO2_HOOK_S` "
            "in plan/estimate/step_time/constants.py (fixed: no published row tells it apart).",
        ]
    )
    write_section(
        "zero_overhead",
        "DeepSpeed ZeRO host cost per parameter tensor (the ZeRO step-time constants)",
        body,
        command="PYTHONPATH=DIR python benchmarks/zero_overhead.py  # DIR: pip install --target DIR --no-deps deepspeed ...",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
