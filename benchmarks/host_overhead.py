"""Host time of eager PyTorch per kernel, and of the HF Trainer per optimizer step, measured on this machine.

Two step-time constants are host work that the published rows of only one source inform:
KERNEL_S (host seconds per eager kernel: Python, op dispatch, autograd, the launch) and
TRAINER_STEP_S (the Trainer loop's own work per optimizer step: dataloader, collation,
logging, scheduler, callbacks). A fold of benchmarks/fit_step_time.py that leaves that
source out has nothing to fit them on and uses their prior: this script measures the prior,
so the held-out rows are predicted from a measurement and never from their own fit. Run on
a CPU (the default), its Trainer figure is also what CPU plans price the Trainer's step at
(step_time/constants.py CPU_TRAINER_STEP_S, kept equal to this file's by a test).

Per kernel: a tiny LlamaForCausalLM (hidden 64, 16 tokens: the device work of every op is a
few microseconds) runs forward and backward with 4 and with 12 decoder layers, full and LoRA
on every linear, without gradient checkpointing and with each of its two forms (reentrant, as the HF
Trainer of transformers 4 ran it; non-reentrant, as transformers 5 and gpuplan's apply run it),
alternating so that load drifts hit both. Host seconds per layer = (t12 - t4) / 8, divided by the
kernels the step-time model counts per layer (plan/estimate/step_time/shape.py
kernels_per_micro_batch, the same count the plan multiplies by KERNEL_S). The prior of KERNEL_S
is the figure without checkpointing; checkpointing's own host work (its Python around the
recomputed kernels) is what a checkpointed layer costs beyond its recomputed kernels, in kernel
launches' worth (checkpoint_host_kernels): shape.py's CHECKPOINT_HOST_KERNELS. On a CPU each op also
runs its tiny kernel inline where a GPU host would queue a launch instead (cudaLaunchKernel, a few
us: NVIDIA CUDA C++ Best Practices Guide). Taking the figure for a GPU host's per-kernel cost
assumes those two are of a size and the host core is as fast as this one: neither is checked on
a GPU here, which is why it is a prior the fit may move and not a fixed constant.

On a CUDA GPU (--device cuda, benchmarks/device/run_checks.sh) the same passes run on the GPU and each is timed
to a torch.cuda.synchronize(): the tiny model's kernels take the device a few us each, fewer than the host needs to
issue them, so the pass is host-bound and its time per layer is the GPU host's (dispatch, autograd and the
cudaLaunchKernel the CPU run has no counterpart of). That file (host_overhead-cuda.json, in benchmarks/data/) is the
prior benchmarks/fit_step_time.py takes when it exists: a GPU host's measurement over this CPU's stand-in.

Per Trainer step: a real transformers Trainer (2 layers, batch 1, 8 micro-batches per step,
logging every step as Qwen's finetune scripts do) against a hand loop over the same tensors
(forward, backward, clip, AdamW, scheduler, zero_grad): the Trainer's median step time minus
the hand loop's is its per-step host work.

    python benchmarks/host_overhead.py [--repeats 100] [--no-write]
    python benchmarks/host_overhead.py --device cuda   # on a GPU host: writes host_overhead-cuda.json
    python benchmarks/host_overhead.py --quick   # CI: few repeats, writes nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "host_overhead.json"
CUDA_DATA = DATA.with_name("host_overhead-cuda.json")  # the same, measured on a GPU host (--device cuda)
TOKENS, HIDDEN = 16, 64
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _config(layers: int) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 128,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }


LAYERS = (4, 12)  # decoder layers of the two models whose difference is timed
MODES = ("none", "reentrant", "non-reentrant")  # activation checkpointing: off, the 2023 HF Trainer's, transformers 5's


def _model(layers: int, lora: bool, ckpt: str, rank: int = 8, device: str = "cpu"):
    """The tiny Llama in training mode, on `device`; `lora`: peft LoRA of `rank` on every linear; `ckpt`: a MODES
    entry, the checkpointing (torch.utils.checkpoint's use_reentrant)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**_config(layers), attn_implementation="sdpa"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, target_modules=list(TARGETS), lora_dropout=0.05))
    if ckpt != "none":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": ckpt == "reentrant"})
        if lora:
            model.enable_input_require_grads()
    model.train()
    return model.to(device)


def _shape(layers: int, lora: bool, ckpt: bool, rank: int = 8):
    """The step-time model's counts (plan/estimate/step_time/shape.py StepShape) for one micro-batch of this model."""
    from gpuplan.hardware.catalog import lookup
    from gpuplan.modelinfo.count import model_facts
    from gpuplan.plan.estimate.memory.types import Adapters, Workload
    from gpuplan.plan.estimate.step_time.shape import build_shape

    facts = model_facts(_config(layers))
    adapters = Adapters(method="lora", r=rank, target_modules=TARGETS, lora_dropout=0.05) if lora else None
    wl = Workload(
        per_device_batch=1,
        seq_len=TOKENS,
        weight_dtype="float32",
        gradient_checkpointing=ckpt,
        attn_implementation="sdpa",
        adapters=adapters,
    )
    return build_shape(facts, wl, lookup("A100-80GB"), "fp32")


def _kernels(layers: int, lora: bool, ckpt: bool) -> int:
    """The kernel launches the step-time model counts for one micro-batch of this model (the recomputed forward's
    too under checkpointing; not checkpointing's own host work, which per_kernel measures against them)."""
    from gpuplan.plan.estimate.step_time.shape import kernels_per_micro_batch

    return kernels_per_micro_batch(_shape(layers, lora, ckpt))


def _synchronize(device: str):
    """What waits for the device's queued work: torch.cuda.synchronize on a GPU, nothing on a CPU (its ops run inline)."""
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def per_kernel(repeats: int, device: str = "cpu") -> list[dict]:
    """Host time per decoder layer of each method x checkpointing mode, and per kernel the model counts."""
    import torch

    torch.set_num_threads(1)  # host work is one thread; the second core stays out of it
    ids = torch.randint(0, 128, (1, TOKENS), device=device)
    sync = _synchronize(device)
    rows = []
    for lora in (False, True):
        for ckpt in MODES:
            models = {n: _model(n, lora, ckpt, device=device) for n in LAYERS}
            times: dict[int, list[float]] = {n: [] for n in LAYERS}
            for i in range(repeats + 5):
                for n, m in models.items():
                    sync()
                    t = time.perf_counter()
                    m(input_ids=ids, labels=ids).loss.backward()
                    sync()
                    if i >= 5:  # the first passes warm the allocator and autograd's caches
                        times[n].append(time.perf_counter() - t)
            few, many = LAYERS
            per_layer = (statistics.median(times[many]) - statistics.median(times[few])) / (many - few)
            kernels = (_kernels(many, lora, ckpt != "none") - _kernels(few, lora, ckpt != "none")) / (many - few)
            rows.append(
                {
                    "method": "lora" if lora else "full",
                    "checkpointing": ckpt,
                    "host_ms_per_layer": round(per_layer * 1e3, 3),
                    "kernels_per_layer": kernels,
                    "us_per_kernel": round(per_layer / kernels * 1e6, 2),
                }
            )
            us = rows[-1]["us_per_kernel"]
            what = f"{rows[-1]['method']:4} ckpt={ckpt:13}"
            print(f"{what} {per_layer * 1e3:6.2f} ms per layer / {kernels:.0f} kernels = {us:.1f} us", flush=True)
    return rows


def checkpoint_host_kernels(rows: list[dict], us: float) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Checkpointing's own host work per checkpointed layer, beyond the kernels it recomputes, in kernel launches'
    worth at `us` (the prior: host us per launch without checkpointing): {mode: [per layer, per LoRA adapter]}, and
    the per-adapter figures before they are floored at zero (measurement noise can put a small one below it).

    A checkpointed row's host time per layer less its method's without checkpointing, less the launches it adds
    (the recomputed forward) at that method's own rate without checkpointing, is its excess in us; the full
    fine-tune's is the layer's, the LoRA rows' excess over it, over their adapters, the adapter's."""
    by = {(r["method"], r["checkpointing"]): r for r in rows}
    adapters = len(TARGETS)
    out, raw = {}, {}
    for mode in MODES[1:]:
        excess = {}
        for method in ("full", "lora"):
            off, on = by[(method, "none")], by[(method, mode)]
            rate = off["host_ms_per_layer"] * 1e3 / off["kernels_per_layer"]
            excess[method] = (on["host_ms_per_layer"] - off["host_ms_per_layer"]) * 1e3 - (
                on["kernels_per_layer"] - off["kernels_per_layer"]
            ) * rate
        raw[mode] = round((excess["lora"] - excess["full"]) / us / adapters, 1)
        out[mode] = [round(excess["full"] / us, 1), max(raw[mode], 0.0)]
    return out, raw


def per_trainer_step(steps: int, device: str = "cpu") -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments, get_linear_schedule_with_warmup

    torch.set_num_threads(1)
    accum = 8
    data = [{"input_ids": torch.randint(0, 128, (TOKENS,))} for _ in range(steps * accum)]
    for d in data:
        d["labels"] = d["input_ids"].clone()

    def fresh():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(**_config(2), attn_implementation="sdpa"))

    class Stamps(TrainerCallback):
        def __init__(self) -> None:
            self.t: list[float] = []

        def on_step_end(self, args, state, control, **kw):
            self.t.append(time.perf_counter())

    stamps = Stamps()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=accum,
            max_steps=steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=device == "cpu",
            disable_tqdm=False,
            learning_rate=1e-4,
            max_grad_norm=1.0,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=fresh(), args=args, train_dataset=data, callbacks=[stamps])
        trainer.train()
    trainer_step = statistics.median(b - a for a, b in zip(stamps.t[2:], stamps.t[3:]))

    model = fresh().to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = get_linear_schedule_with_warmup(opt, 0, steps)
    sync = _synchronize(device)  # the Trainer's logging reads the loss every step: a sync there, one here
    ends = []
    for s in range(steps):
        for d in data[s * accum : (s + 1) * accum]:
            ids, labels = d["input_ids"][None].to(device), d["labels"][None].to(device)  # as the Trainer moves each batch
            loss = model(input_ids=ids, labels=labels).loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        sync()
        ends.append(time.perf_counter())
    hand_step = statistics.median(b - a for a, b in zip(ends[2:], ends[3:]))
    out = {
        "steps": steps,
        "micro_batches_per_step": accum,
        "trainer_ms_per_step": round(trainer_step * 1e3, 2),
        "hand_loop_ms_per_step": round(hand_step * 1e3, 2),
        "trainer_overhead_ms_per_step": round((trainer_step - hand_step) * 1e3, 2),
    }
    print(
        f"Trainer {out['trainer_ms_per_step']:.1f} ms per step, hand loop {out['hand_loop_ms_per_step']:.1f} ms: "
        f"{out['trainer_overhead_ms_per_step']:.1f} ms of Trainer work per step",
        flush=True,
    )
    return out


def unresolved(written: dict[str, float]) -> list[str]:
    """The names of host costs that come out at or below zero as they would be written: a difference of timings on a
    loaded machine can, and a plan takes the figure as a cost (CPU plans price the Trainer's step at this file's
    trainer_step_s: step_time/constants.py CPU_TRAINER_STEP_S), so such a run is not written."""
    return [name for name, value in written.items() if not value > 0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=100, help="timed passes per model")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of the Trainer and of the hand loop")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CI: 4 repeats, 6 steps, writes nothing")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: a GPU host's per-kernel cost")
    ap.add_argument("--json", type=Path, help=f"where the result goes (default {DATA.name}, or {CUDA_DATA.name} with --device cuda)")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.steps, args.no_write = 4, 6, True

    import platform

    import torch
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    rows = per_kernel(args.repeats, args.device)
    trainer = per_trainer_step(args.steps, args.device)
    # the launches alone: without checkpointing (its own host work is checkpoint_host_kernels', in these units)
    us = statistics.median(r["us_per_kernel"] for r in rows if r["checkpointing"] == "none")
    ckpt, ckpt_raw = checkpoint_host_kernels(rows, us)
    trainer_s = trainer["trainer_overhead_ms_per_step"] / 1e3
    print(f"host seconds per kernel (median of 2): {us:.1f} us; Trainer per step: {trainer_s * 1e3:.1f} ms")
    print("checkpointing's host work per layer, in kernel launches [layer, per adapter]: " + json.dumps(ckpt))
    floored = {m: v for m, v in ckpt_raw.items() if v < 0}
    if floored:
        print(f"per-adapter figures below zero, floored at 0 (noise of a difference of differences): {floored}")
    if args.no_write:
        return 0
    if bad := unresolved({"kernel_s": round(us * 1e-6, 8), "trainer_step_s": round(trainer_s, 5)}):
        print(f"not written: {bad} measured no cost above the noise; rerun on a quiet machine", file=sys.stderr)
        return 1
    cpu = platform.processor() or platform.machine()
    gpu = f", {torch.cuda.get_device_name(0)}" if args.device == "cuda" else ""
    result = {
        "what": "priors of KERNEL_S and TRAINER_STEP_S for benchmarks/fit_step_time.py (on a CPU, trainer_step_s is also "
        "constants.CPU_TRAINER_STEP_S), measured by benchmarks/host_overhead.py",
        "machine": f"{cpu}{gpu}, torch {torch.__version__}, transformers {transformers.__version__}, one thread",
        "device": args.device,
        "kernel_s": round(us * 1e-6, 8),
        "trainer_step_s": round(trainer_s, 5),
        "checkpoint_host_kernels": ckpt,
        "checkpoint_adapter_unfloored": ckpt_raw,
        "per_kernel": rows,
        "trainer": trainer,
    }
    path = args.json or (CUDA_DATA if args.device == "cuda" else DATA)
    path.write_text(json.dumps(result, indent=2) + "\n")
    table = [
        "| method | checkpointing | host ms per layer | kernels per layer (the model's count) | us per kernel |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ck = r["checkpointing"]
        table.append(f"| {r['method']} | {ck} | {r['host_ms_per_layer']:.2f} | {r['kernels_per_layer']:.0f} | {r['us_per_kernel']:.1f} |")
    body = "\n".join(
        [
            f"{result['machine']}. Forward and backward of a tiny Llama (hidden {HIDDEN}, {TOKENS} tokens) with "
            f"{LAYERS[1]} and {LAYERS[0]} decoder layers, {args.repeats} passes each, alternating; host time per layer over "
            f"the kernels the step-time model counts for it (benchmarks/data/{path.name}):",
            "",
            *table,
            "",
            f"Without checkpointing, median of full and LoRA: **{us:.1f} us per kernel**, the prior of `KERNEL_S` in "
            "benchmarks/fit_step_time.py (what a fold that leaves out every row depending on it uses).",
            "",
            "Checkpointing's own host work per checkpointed layer (torch.utils.checkpoint: the reentrant form's RNG state and "
            "nested backward, the non-reentrant form's saved-tensor hooks), beyond the kernels it recomputes, in kernel "
            "launches' worth of the same method's host time without it, [per layer, per LoRA adapter]: "
            + ", ".join(f"{mode} **{v}**" for mode, v in ckpt.items())
            + " (plan/estimate/step_time/shape.py CHECKPOINT_HOST_KERNELS; a per-adapter figure below zero is floored at 0: "
            + ", ".join(f"{mode} {v}" for mode, v in ckpt_raw.items())
            + " before).",
            "",
            f"HF Trainer, {trainer['micro_batches_per_step']} micro-batches per step, logging every step: "
            f"{trainer['trainer_ms_per_step']:.1f} ms per optimizer step against {trainer['hand_loop_ms_per_step']:.1f} ms for a "
            f"hand loop over the same tensors: **{trainer_s * 1e3:.1f} ms of Trainer work per step**, the prior of "
            "`TRAINER_STEP_S`"
            + (" and what CPU plans price the Trainer's step at (`CPU_TRAINER_STEP_S`)." if args.device == "cpu" else "."),
        ]
    )
    if args.device == "cuda":
        title = "Host cost per kernel and per Trainer step, on a GPU host (the step-time priors)"
        write_section("host_overhead_cuda", title, body, "python benchmarks/host_overhead.py --device cuda")
    else:
        write_section("host_overhead", "Host cost per kernel and per Trainer step (the step-time priors)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
