"""The kernels a decoder layer launches, counted with torch.profiler, beside the counts the step-time model uses.

plan/estimate/step_time/shape.py prices host work as kernels x KERNEL_S with counts per decoder layer
(LAYER_KERNELS_FWD, BACKWARD_KERNEL_RATIO), per LoRA adapter (ADAPTER_KERNELS_FWD / _BWD), for eager
attention (EAGER_ATTENTION_KERNELS_FWD) and for the head (HEAD_KERNELS), once profiled by hand. This script
counts them again on the installed torch and transformers, so that they can be checked and redone:

- a tiny LlamaForCausalLM (hidden 64, 16 tokens) with 4 and with 8 decoder layers runs a forward, and a forward
  and backward, under torch.profiler; per layer = (n8 - n4) / 4, the head = n4 - 4 x per layer;
- on a CPU (default) a kernel is a top-level aten op (no aten op above it) that does work: views and metadata
  ops (view, transpose, slice, expand, empty, detach, ...) are left out, and to / contiguous / reshape count only
  when they copy (a child _to_copy, copy_ or clone); on a CUDA GPU (--device cuda) it is a cudaLaunchKernel call
  (the runtime API events the profiler records), the launches themselves;
- configurations: fp32 (the model's constants were profiled so), bf16 weights (RMSNorm's casts to fp32 and back
  launch), LoRA (r 8 on the 7 linears; peft) in fp32, and fp32 adapters over a bf16 base under bf16 autocast (peft's
  autocast_adapter_dtype, as gpuplan's apply trains bf16 LoRA), each with SDPA and with eager attention.

What it reports is what the installed stack launches, not what the constants should be: a change of a constant
moves every plan's host terms and the fitted KERNEL_S with it (benchmarks/fit_step_time.py).

    python benchmarks/kernel_counts.py [--no-write]
    python benchmarks/kernel_counts.py --quick   # CI: fp32 and bf16, full, SDPA; writes nothing
    python benchmarks/kernel_counts.py --device cuda   # on a GPU host (benchmarks/device/run_checks.sh)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_overhead import HIDDEN, TARGETS, TOKENS  # noqa: E402  the same tiny Llama as the host-cost measurement
from host_overhead import _config as _tiny_llama  # noqa: E402
from results import write_section  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "kernel_counts.json"
RANK = 8
LAYERS = (4, 8)
# aten ops that launch no kernel: views, metadata, allocation without a fill
NO_WORK = frozenset(
    "aten::" + n
    for n in (
        "view",
        "_unsafe_view",
        "_reshape_alias",
        "view_as",
        "transpose",
        "t",
        "permute",
        "expand",
        "expand_as",
        "slice",
        "select",
        "narrow",
        "unsqueeze",
        "squeeze",
        "as_strided",
        "alias",
        "detach",
        "detach_",
        "split",
        "unbind",
        "chunk",
        "flatten",
        "unflatten",
        "empty",
        "empty_like",
        "empty_strided",
        "lift_fresh",
        "resolve_conj",
        "resolve_neg",
        "result_type",
        "size",
        "stride",
        "numel",
        "dim",
        "is_nonzero",
    )
)
MAYBE_COPY = frozenset({"aten::to", "aten::contiguous", "aten::reshape", "aten::type_as"})
COPIES = frozenset({"aten::_to_copy", "aten::copy_", "aten::clone"})
LAUNCHES = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}
)
# (name, bf16 weights, LoRA, autocast)
CONFIGS = (
    ("fp32", False, False, False),
    ("bf16 weights", True, False, False),
    ("LoRA, fp32", False, True, False),
    ("LoRA fp32 adapters, bf16 base, autocast", True, True, True),
)


def _config(layers: int, attention: str) -> dict:
    return {**_tiny_llama(layers), "attn_implementation": attention}


def _model(layers: int, attention: str, bf16: bool, lora: bool, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**_config(layers, attention)))
    if bf16:
        model = model.to(torch.bfloat16)
    if lora:
        from peft import LoraConfig, get_peft_model

        # get_peft_model's autocast_adapter_dtype (default True) keeps the adapters in fp32 over a bf16 base
        model = get_peft_model(model, LoraConfig(r=RANK, target_modules=list(TARGETS), lora_dropout=0.05))
    model.train()
    return model.to(device)


def _descendants(e) -> list:
    out, todo = [], list(e.cpu_children)
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.cpu_children)
    return out


def device_kernels(events) -> int:
    """Kernels the GPU ran (its own events, copies and fills left out): beside the launch calls, so that a launch API
    the LAUNCHES names miss, or one call that starts several kernels, shows as a difference."""
    return sum(1 for e in events if str(e.device_type).endswith("CUDA") and not e.name.startswith(("Memcpy", "Memset")))


def count_kernels(events, device: str) -> int:
    """Kernels in a profile's events: cudaLaunchKernel calls on a GPU; on a CPU the top-level aten ops that do work."""
    if device == "cuda":
        return sum(1 for e in events if e.name in LAUNCHES)
    n = 0
    for e in events:
        if not e.name.startswith("aten::") or e.name in NO_WORK:
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if parent is not None:
            continue  # inside another aten op: counted with it
        if e.name in MAYBE_COPY and not any(c.name in COPIES for c in _descendants(e)):
            continue
        n += 1
    return n


def _profiled(model, ids, autocast: bool, backward: bool, device: str) -> int:
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile

    def step() -> None:
        model.zero_grad(set_to_none=True)  # as the Trainer leaves them: no accumulate-into-.grad kernels
        ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx:
            loss = model(input_ids=ids, labels=ids).loss
        if backward:
            loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm: lazy initialisation launches once
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    events = prof.events()
    if device == "cuda":
        print(f"    {count_kernels(events, device)} launch calls, {device_kernels(events)} kernels on the device", flush=True)
    return count_kernels(events, device)


def measure(configs, attentions, device: str) -> list[dict]:
    import torch

    ids = torch.randint(0, 128, (1, TOKENS), device=device)
    rows = []
    for name, bf16, lora, autocast in configs:
        for attention in attentions:
            counts = {}
            for layers in LAYERS:
                model = _model(layers, attention, bf16, lora, device)
                fwd = _profiled(model, ids, autocast, False, device)
                both = _profiled(model, ids, autocast, True, device)
                counts[layers] = (fwd, both - fwd)
            few, many = LAYERS
            fwd = (counts[many][0] - counts[few][0]) / (many - few)
            bwd = (counts[many][1] - counts[few][1]) / (many - few)
            head = counts[few][0] + counts[few][1] - few * (fwd + bwd)
            rows.append({"config": name, "attention": attention, "layer_forward": fwd, "layer_backward": bwd, "head_both": head})
            print(f"{name:42} {attention:5}: a layer {fwd:g} forward, {bwd:g} backward; the rest {head:g}", flush=True)
    return rows


def _derived(rows: list[dict]) -> dict:
    """The model's kinds of count from the rows: per adapter (LoRA less the same base, over its 7 adapters), eager's
    extra per layer forward, bf16's extra per layer."""
    by = {(r["config"], r["attention"]): r for r in rows}
    out: dict = {}
    base = by.get(("fp32", "sdpa"))
    if base:
        out["layer"] = [base["layer_forward"], base["layer_backward"]]
        out["head_both"] = base["head_both"]
    if base and ("fp32", "eager") in by:
        eager = by[("fp32", "eager")]
        out["eager_extra_forward"] = eager["layer_forward"] - base["layer_forward"]
    if base and ("bf16 weights", "sdpa") in by:
        b = by[("bf16 weights", "sdpa")]
        out["bf16_extra"] = [b["layer_forward"] - base["layer_forward"], b["layer_backward"] - base["layer_backward"]]
    for name, ref in (("LoRA, fp32", "fp32"), ("LoRA fp32 adapters, bf16 base, autocast", "bf16 weights")):
        if (name, "sdpa") in by and (ref, "sdpa") in by:
            lo, re_ = by[(name, "sdpa")], by[(ref, "sdpa")]
            out["adapter " + name] = [
                round((lo["layer_forward"] - re_["layer_forward"]) / len(TARGETS), 2),
                round((lo["layer_backward"] - re_["layer_backward"]) / len(TARGETS), 2),
            ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--json", type=Path, help="where the counts go (default kernel_counts.json, or kernel_counts-cuda.json with --device cuda)"
    )
    ap.add_argument("--quick", action="store_true", help="CI: fp32 and bf16 weights, SDPA; writes nothing")
    args = ap.parse_args()
    import torch
    import transformers

    from gpuplan.plan.estimate.step_time import shape as S

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    configs, attentions = (CONFIGS[:2], ("sdpa",)) if args.quick else (CONFIGS, ("sdpa", "eager"))
    rows = measure(configs, attentions, args.device)
    derived = _derived(rows)
    model = {
        "layer": [S.LAYER_KERNELS_FWD, round(S.LAYER_KERNELS_FWD * S.BACKWARD_KERNEL_RATIO, 1)],
        "head_both": 2 * S.HEAD_KERNELS,
        "eager_extra_forward": S.EAGER_ATTENTION_KERNELS_FWD,
        "adapter": [S.ADAPTER_KERNELS_FWD, S.ADAPTER_KERNELS_BWD],
    }
    print("counted: " + json.dumps(derived))
    print("the model's constants: " + json.dumps(model))
    if args.no_write or args.quick:
        return 0
    machine = f"{args.device}, torch {torch.__version__}, transformers {transformers.__version__}"
    result = {"what": "kernels per decoder layer, counted by benchmarks/kernel_counts.py", "machine": machine, "rows": rows}
    result.update(derived=derived, model=model)
    path = args.json or DATA.with_name("kernel_counts-cuda.json" if args.device == "cuda" else DATA.name)
    path.write_text(json.dumps(result, indent=2) + "\n")
    table = ["| configuration | attention | a layer: forward | backward | the rest (embedding, head, loss) |", "|---|---|---|---|---|"]
    table += [f"| {r['config']} | {r['attention']} | {r['layer_forward']:g} | {r['layer_backward']:g} | {r['head_both']:g} |" for r in rows]

    def pair(v) -> str:
        return f"{v[0]:g} forward, {v[1]:g} backward"

    body = "\n".join(
        [
            f"{machine}. A tiny Llama (hidden {HIDDEN}, {TOKENS} tokens), {LAYERS[1]} vs {LAYERS[0]} layers; a kernel is a "
            + ("cudaLaunchKernel call" if args.device == "cuda" else "top-level aten op that does work (views left out)")
            + ":",
            "",
            *table,
            "",
            f"Counted: a layer {pair(derived['layer'])}; eager attention {derived['eager_extra_forward']:g} more forward; "
            f"bf16 weights {pair(derived['bf16_extra'])} more (RMSNorm's casts); per LoRA adapter, as the model composes a "
            "LoRA layer (the full layer's count plus its adapters': the frozen base's dW GEMMs come out of it), "
            f"{pair(derived['adapter LoRA, fp32'])} in fp32, {pair(derived['adapter LoRA fp32 adapters, bf16 base, autocast'])} "
            f"as fp32 adapters over a bf16 base under autocast; the rest of the model {derived['head_both']:g}.",
            "",
            f"The step-time model's constants (plan/estimate/step_time/shape.py): a layer {pair(model['layer'])}; eager "
            f"attention {model['eager_extra_forward']} more forward; bf16 weights none more; a LoRA adapter "
            f"{pair(model['adapter'])}; the rest {model['head_both']}.",
        ]
    )
    if args.device == "cuda":
        command = "python benchmarks/kernel_counts.py --device cuda"
        write_section("kernel_counts_cuda", "Kernels per decoder layer, counted on a GPU host", body, command)
    else:
        write_section("kernel_counts", "Kernels per decoder layer, counted", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
