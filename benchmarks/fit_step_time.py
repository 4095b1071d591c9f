"""Fit the step-time model's few free constants on the published measured runs.

The constants (gpuplan/plan/estimate/step_time/constants.py): the large-GEMM efficiency per GPU
architecture class (not per SKU), and, shared by every class, the per-kernel launch
cost, the GEMM half-saturation M, the Trainer's per-step cost, the 4-bit dequantization
bandwidth fraction, DeepSpeed ZeRO-3's per-tensor hook cost and the achieved PCIe
fraction. The rows: every usable row of published-throughput.json
(benchmarks/published_rows.py), planned with its own settings; no row, model or
source has a constant of its own.

Objective: the mean over sources of each source's mean |log(plan / measured)| (a
source's many rows weigh as much as another's few), minimised by Nelder-Mead over the
logs of the constants from the values in constants.py. Prints the fitted values to
put into constants.py and the errors they give.

    python benchmarks/fit_step_time.py [--iterations 600] [--holdout]
    python benchmarks/fit_step_time.py --quick   # CI: 5 iterations, writes nothing
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_rows import error, predict, source_name, usable_runs  # noqa: E402
from results import write_section  # noqa: E402

from gpuplan.plan.estimate.step_time import constants as K  # noqa: E402

CLASSES = ("ampere-dc", "hopper", "ampere", "ada")
GLOBALS = ("M_HALF_TOKENS", "TRAINER_STEP_S", "DEQUANT_BW_FRACTION", "ZERO3_HOOK_S", "PCIE_FRACTION")
NAMES = [f"eta[{c}]" for c in CLASSES] + ["kernel_s"] + list(GLOBALS)
# Upper bounds: fractions stay fractions; the Trainer's per-step host work (logging, LR
# scheduler, callbacks, dataloader hand-off) is tens of milliseconds, not more: a fit
# that wants more is absorbing another term's error.
BOUNDS = {"DEQUANT_BW_FRACTION": 1.0, "PCIE_FRACTION": 1.0, "TRAINER_STEP_S": 0.05}


def current() -> list[float]:
    return [K.FITTED[c].matmul_efficiency for c in CLASSES] + [K.FITTED["ampere-dc"].kernel_s] + [getattr(K, g) for g in GLOBALS]


def apply(values: list[float]) -> None:
    etas, kernel, rest = values[: len(CLASSES)], values[len(CLASSES)], values[len(CLASSES) + 1 :]
    for c, eta in zip(CLASSES, etas):
        K.FITTED[c] = dataclasses.replace(K.FITTED[c], matmul_efficiency=min(eta, 0.95), kernel_s=kernel)
    for g, v in zip(GLOBALS, rest):
        setattr(K, g, min(v, BOUNDS.get(g, math.inf)))


def errors(runs) -> dict[str, list[float]]:
    by: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        by[source_name(r.row)].append(error(r, predict(r)))
    return by


def objective(logs: list[float], runs) -> float:
    apply([math.exp(x) for x in logs])
    by = errors(runs)
    return statistics.mean(statistics.mean(abs(math.log1p(e)) for e in v) for v in by.values())


def report(runs) -> list[str]:
    by = errors(runs)
    every = [abs(e) for v in by.values() for e in v]
    lines = [
        f"  {s}: {len(v)} rows, median |error| {statistics.median(map(abs, v)):.1%}, max {max(map(abs, v)):.1%}" for s, v in by.items()
    ]
    lines.append(f"  overall: {len(every)} rows, median {statistics.median(every):.1%}, max {max(every):.1%}")
    print("\n".join(lines))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=600)
    ap.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md as it is")
    ap.add_argument(
        "--holdout", action="store_true", help="fit on every other row of each source, report the rows left out (a memorisation check)"
    )
    ap.add_argument(
        "--start", type=lambda t: [float(x) for x in t.split(",")], default=None, help="comma-separated start values, in the order printed"
    )
    ap.add_argument("--quick", action="store_true", help="CI: 5 Nelder-Mead iterations, RESULTS.md left alone")
    args = ap.parse_args()
    if args.quick:
        args.iterations, args.no_write = 5, True
    from scipy.optimize import minimize

    runs, _ = usable_runs()
    held: list = []
    if args.holdout:
        seen: dict[str, int] = defaultdict(int)
        fit, held = [], []
        for r in runs:
            src = source_name(r.row)
            (fit if seen[src] % 2 == 0 else held).append(r)
            seen[src] += 1
        runs = fit
    print("start:")
    report(runs)
    x0 = [math.log(v) for v in (args.start or current())]
    res = minimize(objective, x0, args=(runs,), method="Nelder-Mead", options={"maxiter": args.iterations, "xatol": 1e-3, "fatol": 1e-5})
    apply([math.exp(x) for x in res.x])
    values = current()  # as applied: bounded
    out = [
        f"fitted on {len(runs)} rows ({res.nit} iterations, objective {res.fun:.4f}):",
        *(f"  {name} = {v:.4g}" for name, v in zip(NAMES, values)),
    ]
    print("\n".join(out))
    out += ["errors on the rows fitted:", *report(runs)]
    if held:
        print("held-out rows (not in this fit):")
        out += ["errors on the held-out rows (every other row of each source, not in this fit):", *report(held)]
    if not args.no_write:
        name = "fit_step_time_holdout" if held else "fit_step_time"
        title = "Step-time fit, half the rows held out" if held else "Step-time fit (the constants in constants.py)"
        write_section(
            name,
            title,
            "```text\n" + "\n".join(out) + "\n```",
            command="python benchmarks/fit_step_time.py" + (" --holdout" if held else ""),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
