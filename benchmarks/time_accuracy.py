"""How close the plan's step time is to a measured CPU run, before and after calibration.

For three sizes of a from-scratch Llama (the tiny-corpus byte vocabulary, seq_len 128,
16 sequences per step), on this machine's CPU:
  1. `gpuplan plan` with an empty calibration store: the default estimate (the step-time
     model with this CPU's matmul rate and bandwidth measured by hardware/cpu_probe.py,
     into a fresh probe file at the start of this script);
  2. `gpuplan apply` twice (run A, run B), each into its own calibration store;
  3. `gpuplan plan` calibrated by run A of the same size ("self"), by run A of the
     smallest size only ("from smallest": the FLOPs-per-token scaling across specs), and
     by runs A of the two OTHER sizes ("fit": the work and fixed-cost scales fitted over them);
  4. both compared with run B, a run the calibration never saw.
Writes its section of benchmarks/RESULTS.md.

    python benchmarks/time_accuracy.py [--steps 20]
    python benchmarks/time_accuracy.py --quick   # CI: size S only, 3 steps, writes nothing
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROBE = str(Path(tempfile.mkdtemp(prefix="gpuplan-probe-")) / "cpu-probe.json")  # measured by the first plan
BASE = json.loads((ROOT / "specs" / "models" / "tiny-llama-cpu.json").read_text())
SIZES = {  # name: (hidden, layers, heads, kv heads, intermediate)
    "S": (64, 2, 2, 1, 172),
    "M": (128, 4, 4, 2, 344),  # specs/tiny.toml's model
    "L": (256, 6, 8, 4, 688),
}
SPEC = """[model]
config = "{config}"
from_scratch = true
task = "causal-lm"
[hardware]
gpu = "cpu"
[data]
train_files = ["{corpus}"]
seq_len = 128
[training]
effective_batch_size = 16
learning_rate = 3e-3
max_steps = {steps}
logging_steps = 5
save_steps = 100000
seed = 0
[output]
dir = "{out}"
"""


def python_path() -> str:
    """PYTHONPATH for the gpuplan commands: this checkout first, unless the caller's path already has it."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if any(Path(e).resolve() == ROOT for e in entries):
        return os.pathsep.join(entries)
    return os.pathsep.join([str(ROOT), *entries])


def gpuplan(args: list[str], store: Path) -> str:
    env = {**os.environ, "GPUPLAN_CALIBRATION_FILE": str(store), "PYTHONPATH": python_path(), "GPUPLAN_CPU_PROBE_FILE": PROBE}
    return subprocess.run([sys.executable, "-m", "gpuplan", *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout


def plan_step(spec: Path, store: Path) -> tuple[float, dict]:
    t = json.loads(gpuplan(["plan", str(spec), "--json"], store))["throughput"]
    return t["step_time_s"], t


def apply(spec: Path, out: Path, store: Path) -> dict:
    gpuplan(["apply", str(spec), "--yes", "--restart"], store)
    return json.loads((out / "gpuplan-state.json").read_text())["results"]["calibration"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="CI: size S only, 3 steps, RESULTS.md left alone")
    args = ap.parse_args()
    sizes = {"S": SIZES["S"]} if args.quick else SIZES
    if args.quick:
        args.steps = 3
    tmp = Path(tempfile.mkdtemp(prefix="gpuplan-time-"))
    rows, specs = {}, {}
    for name, (h, layers, heads, kv, inter) in sizes.items():
        cfg = {
            **BASE,
            "hidden_size": h,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "intermediate_size": inter,
        }
        (tmp / f"{name}.json").write_text(json.dumps(cfg))
        out = tmp / f"run-{name}"
        spec = tmp / f"{name}.toml"
        spec.write_text(
            SPEC.format(config=tmp / f"{name}.json", corpus=ROOT / "specs" / "data" / "tiny-corpus.txt", steps=args.steps, out=out)
        )
        specs[name] = (spec, out)
        before, t = plan_step(spec, tmp / "empty.jsonl")
        a = apply(spec, out, tmp / f"A-{name}.jsonl")
        b = apply(spec, out, tmp / f"B-{name}.jsonl")
        rows[name] = {
            "model_flops_per_token": t["model_flops_per_token"],
            "before": before,
            "A": a,
            "B": b,
            "self": plan_step(spec, tmp / f"A-{name}.jsonl")[0],
        }
        print(name, json.dumps({k: v for k, v in rows[name].items() if k not in ("A", "B")}), flush=True)
    smallest = tmp / f"A-{next(iter(sizes))}.jsonl"
    for name, (spec, _) in specs.items():
        rows[name]["cross"] = plan_step(spec, smallest)[0]
        others = tmp / f"others-{name}.jsonl"
        others.write_text("".join((tmp / f"A-{o}.jsonl").read_text() for o in sizes if o != name))
        rows[name]["fit"] = plan_step(spec, others)[0]

    figures = json.loads(Path(PROBE).read_text())["machines"][-1]
    probe = f"{figures['fp32_tflops']:.3f} TFLOP/s fp32 matmul, {figures['gbyte_per_s']:.1f} GB/s copy"

    def err(est: float, measured: float) -> str:
        return f"{est:.3f} ({(est / measured - 1) * 100:+.0f}%)"

    lines = [
        "| model | params | FLOPs/token | default estimate (s/step) | run A measured | run B measured "
        "| calibrated by A, same size | calibrated by A of size S | fitted on A of the other sizes "
        "| utilisation A / B | MFU A |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        a, b = r["A"], r["B"]
        mb = b["step_time_s"]
        lines.append(
            f"| {name} | {a['n_params'] / 1e6:.2f}M | {a['flops_per_token'] / 1e6:.1f}M | {err(r['before'], mb)} | "
            f"{a['step_time_s']:.3f} | {mb:.3f} | {err(r['self'], mb)} | {err(r['cross'], mb)} | {err(r['fit'], mb)} | "
            f"{a['utilisation']:.1%} / {b['utilisation']:.1%} | {a['mfu']:.1%} |"
        )
    load, cpus = os.getloadavg()[2], os.cpu_count() or 1
    busy = "; the machine is busy, so runs of the same spec can differ by tens of percent" if load > cpus else ""
    body = (
        f"CPU runs of `gpuplan apply` ({args.steps} steps, 16 x 128 tokens per step; the step time is the steady "
        "one, after the first step, as apply records it for calibration: apply/train/calibrate.py) on this "
        f"machine's {cpus} cores (load average {load:.1f} over the last 15 minutes{busy}). Run B, which no "
        "calibration saw, is the reference. Percentages: the estimate against run B. "
        f'"default" is the uncalibrated step-time model (plan/estimate/step_time, cpu constants) with this CPU\'s '
        f"figures measured by hardware/cpu_probe.py at the start ({probe}); "
        '"same size" the plan after run A of that spec; "of size S" the plan after run A of the smallest '
        'model only (carried to another spec through the model\'s terms); "fitted" the plan after runs A of '
        "the two "
        "other sizes (work and fixed-cost scales, least squares: plan/estimate/calibration.py).\n\n" + "\n".join(lines)
    )
    print(body)
    if not args.quick:
        write_section("time_accuracy", "Time estimates (CPU)", body)


if __name__ == "__main__":
    main()
