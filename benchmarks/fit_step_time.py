"""Fit the step-time model's few free constants on the published runs; report leave-one-source-out error.

The constants (gpuplan/plan/estimate/step_time/constants.py, all global: none is per GPU
class, SKU, model, row or source): the fraction of the Maximum Achievable Matmul FLOPS a
training step's GEMMs reach, the per-kernel launch cost, the GEMM half-saturation M, the
Trainer's per-step cost, the 4-bit dequantization bandwidth fraction, DeepSpeed ZeRO-3's
per-tensor hook cost and the achieved PCIe fraction. The per-class differences come from
measurements and datasheets (MAMF per class, FlashAttention-2's rate on Hopper), not from
this fit. The rows: every usable row of published-throughput.json (benchmarks/published_rows.py),
planned with its own settings.

Headline: leave-one-source-out cross-validation. For each source (a repository that
published rows), the constants are fitted on the OTHER sources' rows and that source's
rows are predicted; a constant no row of the fold depends on stays at its physical prior
(PARAMS). The error reported per source and overall is on rows the fit never saw; the
in-sample figure (all rows in the fit, the constants shipped) stands beside it. Every
constant has a physical bound with its source; the report says whether any fit sits at
one, and its spread across the folds.

The objective has more than one valley. Each fold's fit is the best of Nelder-Mead from the priors
and from FOLD_STARTS seeded random starts within the bounds (none taken from the held-out rows);
the shipped constants are the best all-row fit started from the priors or from any fold's
constants; the held-out errors are each fold's own fit.

Objective: the mean over sources of each source's mean |log(plan / measured)| (a
source's many rows weigh as much as another's few), plus a log-normal prior on each constant
around its physical prior (prior_term: weighed as PRIOR_SCALE / rows, so that rows and
priors are in the units of one likelihood), minimised by bounded Nelder-Mead over the logs
of the constants. The prior pulls a constant that a fold's rows cannot tell apart from
another toward its measurement; it does not forbid a bound (RESULTS.md says whether any fold
still reaches one).

    python benchmarks/fit_step_time.py [--iterations 600]
    python benchmarks/fit_step_time.py --quick   # CI: 5 iterations, the in-sample fit only, writes nothing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_rows  # noqa: E402
from published_rows import predict, source_name, usable_runs  # noqa: E402
from results import write_section  # noqa: E402

from gpuplan.plan.estimate.step_time import constants as K  # noqa: E402

SPREAD_JSON = Path(__file__).resolve().parents[1] / "gpuplan" / "plan" / "estimate" / "step_time" / "spread.json"
# Priors of the host-work constants, measured (benchmarks/host_overhead.py): a fold without the rows that depend on
# one predicts from the measurement, never from the held-out source's own fit.
# A GPU host's measurement (host_overhead.py --device cuda, benchmarks/device/run_checks.sh) when there is one: the CPU
# run stands in for it (its ops run inline where a GPU host queues launches, on another processor).
_HOST_FILES = [Path(__file__).resolve().parent / "data" / n for n in ("host_overhead-cuda.json", "host_overhead.json")]
HOST = json.loads(next(p for p in _HOST_FILES if p.exists()).read_text())
HOST_WHERE = "a GPU host" if HOST.get("device") == "cuda" else "one CPU core"
ZERO = json.loads((Path(__file__).resolve().parent / "data" / "zero_overhead.json").read_text())  # benchmarks/zero_overhead.py
PCIE_PRIOR = 0.13  # sqrt(0.10 x 0.17): see PCIE_FRACTION's Param


@dataclass(frozen=True)
class Param:
    name: str  # attribute of constants.py
    lower: float
    upper: float
    prior: float  # the physics estimate a fold uses when none of its rows depends on the constant
    why: str  # where the bounds and the prior come from
    width: float | None = None  # the prior's log-span (sigma = width / 4); default: the bounds'


def _eta(cls: str) -> Param:
    mamf, why = K.MAMF.get(cls, K.MAMF_DEFAULT)
    return Param(
        f"ETA[{cls}]",
        0.2,
        mamf,
        K.PRIOR_OF_BOUND * mamf,
        f"<= {mamf:.3g}: {why}; prior {K.PRIOR_OF_BOUND:g} of it; >= 0.2: whole training steps of large models reach 30-60% of the peak "
        "(Chowdhery et al. 2022, PaLM, table 3; Shoeybi et al. 2019 sec. 5.1)",
    )


PARAMS = (
    *(_eta(c) for c in K.ETA),
    Param(
        "KERNEL_S",
        3e-6,
        6e-5,
        HOST["kernel_s"],
        "eager PyTorch op overhead: ~10 us per op, a few us in C++ alone (H. He 2022, 'Making Deep Learning Go Brrrr From "
        "First Principles', overhead section); CUDA launch alone ~3-5 us (NVIDIA CUDA C++ Best Practices Guide); prior "
        f"{HOST['kernel_s'] * 1e6:.1f} us: measured per kernel the model counts, forward and backward of a tiny Llama without "
        f"checkpointing (whose own host work is priced apart), on {HOST_WHERE} ({HOST['machine']}; benchmarks/host_overhead.py)",
    ),
    Param(
        "M_HALF_TOKENS",
        32.0,
        2048.0,
        256.0,
        "one 128-256-row CTA tile per SM (cuBLAS/CUTLASS tile shapes) over 108-132 SMs: a few hundred "
        "rows fill one wave (NVIDIA Matrix Multiplication Background User's Guide, 'wave quantization')",
    ),
    Param(
        "TRAINER_STEP_S",
        1e-4,
        0.1,
        HOST["trainer_step_s"],
        "the HF Trainer's per-step host work (logging .item() sync, scheduler, callbacks, collation): from ~0.1 ms (a step "
        "that logs nothing: scheduler.step(), the callbacks' hooks and zero_grad() in Python) to tens of ms; prior "
        f"{HOST['trainer_step_s'] * 1e3:.1f} ms: a real Trainer's step against a hand loop over the same "
        f"tensors, 8 micro-batches, logging every step, on {HOST_WHERE} (benchmarks/host_overhead.py)",
    ),
    Param(
        "DEQUANT_BW_FRACTION",
        0.05,
        0.8,
        0.25,
        "<= HBM_FRACTION (a streaming copy, Jia et al. 2018); bitsandbytes dequantize_4bit reads "
        "0.5 B and writes 2 B per weight in small blocks (bitsandbytes/functional.py)",
    ),
    Param(
        "GPTQ_DEQUANT_BW_FRACTION",
        0.05,
        0.8,
        published_rows.GPTQ_DEQUANT_PRIOR,
        "as DEQUANT_BW_FRACTION, for the GPTQ int4 rows; prior "
        f"{published_rows.GPTQ_DEQUANT_PRIOR:.3g}: auto-gptq's eager dequantization, "
        f"{published_rows.GPTQ_EAGER_BYTES} B per weight per pass at HBM_FRACTION (benchmarks/published_rows.py)",
    ),
    Param(
        "ZERO3_HOOK_S",
        2e-5,
        2e-3,
        ZERO["zero3_hook_s"],
        "Python pre/post-forward hooks per module parameter (deepspeed/runtime/zero/"
        "partitioned_param_coordinator.py): tens to hundreds of us each (Rajbhandari et al. 2021, ZeRO-Infinity sec. 6); "
        f"prior {ZERO['zero3_hook_s'] * 1e6:.0f} us: measured per parameter tensor per pass, a real DeepSpeed ZeRO-3 engine "
        "against the plain model, tiny Llama, one CPU rank (benchmarks/zero_overhead.py)",
    ),
    Param(
        "PCIE_FRACTION",
        0.05,
        0.9,
        PCIE_PRIOR,
        "<= ~0.9: PCIe TLP/DLLP overhead (PCI-SIG spec: 128b/130b + headers); >= 0.05: GeForce cards "
        "have no P2P, NCCL stages through host memory (NCCL docs, SHM transport), on PCIe 3.0 x8 ~ 4 GB/s; prior "
        f"{PCIE_PRIOR}: two GeForce cards (RTX 3070 Ti, PCIe 4.0) on a PCIe 3.0 board measured 3.3-5.5 GB/s card to card "
        "through the host bridge (CUDA BusGrind, Level1Techs forum 'GPU -> GPU expected bandwidth'), "
        "0.10-0.17 of the 32 GB/s a PCIe 4.0 x16 card is catalogued with; their geometric mean",
    ),
)
NAMES = [p.name for p in PARAMS]
AT_BOUND = 0.02  # within 2% (in log) of a bound counts as "at the bound"
RESTARTS = 2  # Nelder-Mead runs per fit, each from the last one's end
# Starts per fold beside the priors: log-uniform within the bounds, seeded (the same every run). A fold's objective has
# several valleys of nearly equal depth, and which one Nelder-Mead stops in from the priors alone moved the held-out
# max error of a source between x1.5 and x2.4; none of these starts looks at the held-out rows.
FOLD_STARTS = 6
# The Laplace scale of the rows' log errors, which prior_term's weight divides by the rows: the in-sample fit's mean
# |log(plan / measured)| before the priors entered the objective (0.061, RESULTS.md at e32183f).
PRIOR_SCALE = 0.06
MIN_GROUP = 8  # held-out rows a bound-by group needs for a spread of its own
PROFILE_SPREAD = 1.5  # a fold's constant this far (x or /) from the all-row value is profiled (profile() below)


def _home(name: str):
    """The module a constant lives in: the plan's constants, or the benchmark rows' (GPTQ)."""
    return published_rows if hasattr(published_rows, name) else K


def current() -> list[float]:
    return [float(K.ETA[p.name[4:-1]] if p.name.startswith("ETA[") else getattr(_home(p.name), p.name)) for p in PARAMS]


def apply(values: list[float]) -> None:
    for p, v in zip(PARAMS, values):
        v = min(max(v, p.lower), p.upper)
        if p.name.startswith("ETA["):
            K.ETA[p.name[4:-1]] = v
        else:
            setattr(_home(p.name), p.name, v)


def errors(runs, row_left_out: bool = False) -> dict[str, list[float]]:
    """Each source's errors (published_rows.evaluate: a tokens group's rows from the group's length, fitted on all of
    its rows for the objective, on the group's other rows for a report: `row_left_out`)."""
    by: dict[str, list[float]] = defaultdict(list)
    for r, e in zip(runs, published_rows.evaluate(runs, row_left_out=row_left_out)[0]):
        by[source_name(r.row)].append(e)
    return by


def prior_term(values: list[float], rows: int) -> float:
    """The priors' share of the objective: PRIOR_SCALE / rows x sum of z^2 / 2, z = log(value / prior) over PARAMS'
    sigma (a quarter of the log-span of its bounds). The rows' term is a Laplace likelihood's (mean |log error|) divided
    by rows / PRIOR_SCALE, so this is a log-normal prior on each constant in the same units: a constant the rows pin
    hardly moves, one they cannot tell apart from another (TRAINER_STEP_S without a sweep of accumulation steps) is pulled
    toward its measured prior (not held there: a weak pull loses to the rows'); the fewer the rows, the more the priors
    count."""
    return PRIOR_SCALE / rows * sum((math.log(v / p.prior) / sigma(p)) ** 2 / 2 for p, v in zip(PARAMS, values))


def sigma(p: Param) -> float:
    return (p.width or math.log(p.upper / p.lower)) / 4


def objective_at(values: list[float], runs) -> float:
    """The mean over sources of each source's mean |log(plan / measured)|, plus prior_term."""
    apply(values)
    by = errors(runs)
    rows = statistics.mean(statistics.mean(abs(math.log1p(e)) for e in v) for v in by.values())
    return rows + prior_term([min(max(v, p.lower), p.upper) for p, v in zip(PARAMS, values)], len(runs))


def identified(runs, base: list[float]) -> list[bool]:
    """Whether `runs` can fit each constant: some row depends on it (its value x 2 moves a prediction), and, for the
    Trainer's per-step cost, some source sweeps the accumulation steps (sweeps_accumulation)."""
    apply(base)
    ref = [predict(r)["tokens_per_second"] for r in runs]
    out = []
    for i in range(len(PARAMS)):
        moved = list(base)
        moved[i] = base[i] * 2 if base[i] * 2 <= PARAMS[i].upper else base[i] / 2
        apply(moved)
        out.append(any(abs(predict(r)["tokens_per_second"] / t - 1) > 1e-6 for r, t in zip(runs, ref)))
    apply(base)
    if not sweeps_accumulation(runs):
        out[NAMES.index("TRAINER_STEP_S")] = False
    return out


def sweeps_accumulation(runs) -> bool:
    """Whether some source's HF Trainer rows run more than one count of accumulation steps. Only such a sweep tells the
    Trainer's cost per optimizer step from a cost per micro-batch: at one count, the per-step cost is that count times a
    per-micro-batch one, which the kernel launches already price, and rows of other sources differ in model and framework
    too. ms-swift's sweep (1-64) is the only one: without it the constant keeps its measured prior (the fold without
    ms-swift, fitted, put it at its 0.1 s bound, where holding it at the all-row value cost its objective 3.3%)."""
    counts: dict[str, set[int]] = defaultdict(set)
    for r in runs:
        if r.hf_trainer:
            counts[source_name(r.row)].add(r.workload.gradient_accumulation_steps)
    return any(len(c) > 1 for c in counts.values())


def fit(runs, iterations: int, start: list[float] | None = None) -> tuple[list[float], list[bool], float, int]:
    """(values, identified, objective, iterations) fitted on `runs`; unidentified constants at their prior.
    `start`: where Nelder-Mead starts (default: the priors); the unidentified constants stay at their prior."""
    from scipy.optimize import minimize

    prior = [p.prior for p in PARAMS]
    free = identified(runs, prior)
    idx = [i for i, f in enumerate(free) if f]

    def full(x) -> list[float]:
        v = list(prior)
        for i, xi in zip(idx, x):
            v[i] = math.exp(xi)
        return v

    x0 = [math.log(min(max((start or prior)[i], PARAMS[i].lower), PARAMS[i].upper)) for i in idx]
    bounds = [(math.log(PARAMS[i].lower), math.log(PARAMS[i].upper)) for i in idx]
    nit = 0
    for _ in range(RESTARTS):  # Nelder-Mead restarted from where it stopped: a fresh simplex escapes a collapsed one
        res = minimize(
            lambda x: objective_at(full(x), runs),
            x0,
            method="Nelder-Mead",
            bounds=bounds,
            options={"maxiter": iterations, "xatol": 1e-3, "fatol": 1e-5, "adaptive": True},
        )
        x0, nit = list(res.x), nit + int(res.nit)
    values = full(res.x)
    apply(values)
    return values, free, float(res.fun), nit


def random_starts(seed: str) -> list[list[float]]:
    """FOLD_STARTS starting points, log-uniform within each constant's bounds, seeded by `seed` (a fold's source)."""
    rng = random.Random(seed)
    return [[math.exp(rng.uniform(math.log(p.lower), math.log(p.upper))) for p in PARAMS] for _ in range(FOLD_STARTS)]


def best_fit(runs, iterations: int, seed: str) -> tuple[list[float], list[bool], float, int]:
    """The lowest-objective fit on `runs` from the priors and from random_starts(seed): none of the starts comes from
    rows outside `runs`, so a fold's held-out error stays that of a fit that never saw them."""
    best = fit(runs, iterations)
    for start in random_starts(seed):
        cand = fit(runs, iterations, start=start)
        if cand[2] < best[2]:
            best = cand
    apply(best[0])
    return best


def held_out(
    runs, src: str, iterations: int, seed: str, also: tuple[str, ...] = ()
) -> tuple[tuple[list[float], list[bool], float, int], list[float]]:
    """The fold without source `src` (and the sources `also`): its fit (best_fit from `seed`'s starts) and the errors on
    `src`'s rows (a tokens group's row from its group's other rows: evaluate's row_left_out)."""
    out = {src, *also}
    fitted = best_fit([r for r in runs if source_name(r.row) not in out], iterations, seed=seed)
    test = [r for r in runs if source_name(r.row) == src]
    return fitted, published_rows.evaluate(test, row_left_out=True)[0]


def profile(runs, iterations: int, i: int, value: float, seed: str) -> float:
    """The objective over `runs` with constant `i` held at `value` and the others refitted: how much worse the rows find
    that value once the rest may make up for it (a single-constant move would miss two constants trading off)."""
    global PARAMS
    kept = PARAMS
    p = kept[i]
    # held by its bounds; its prior and the prior's width stay, so its prior term counts as in the fold's own fit
    held = Param(p.name, value * 0.9999, value * 1.0001, p.prior, p.why, math.log(p.upper / p.lower))
    PARAMS = kept[:i] + (held,) + kept[i + 1 :]
    try:
        return best_fit(runs, iterations, seed=seed)[2]  # as the fold was fitted, so the two objectives compare
    finally:
        PARAMS = kept


_RUNS: list = []  # main's rows, set before any job runs: a forked worker finds them (and published_rows' caches) as they are


def _job(call: tuple):
    """One fit of main's: ("fit", iterations, start), ("fold", source, iterations, seed, also) or ("profile", source,
    iterations, constant index, value), on _RUNS."""
    kind, *args = call
    if kind == "fit":
        return fit(_RUNS, args[0], start=args[1])
    if kind == "fold":
        return held_out(_RUNS, *args)
    src, iterations, i, value = args
    return profile([r for r in _RUNS if source_name(r.row) != src], iterations, i, value, seed=src)


def run_jobs(calls: list[tuple], jobs: int) -> list:
    """_job of each call, in order: in `jobs` forked processes side by side (each fit is deterministic, seeded, and
    touches only its own process's constants, so the results are those of running them one after another)."""
    if jobs <= 1 or len(calls) <= 1:
        return [_job(c) for c in calls]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(min(jobs, len(calls)), mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_job, calls))


def at_bound(p: Param, v: float) -> str:
    if math.log(v / p.lower) < AT_BOUND:
        return "LOWER"
    if math.log(p.upper / v) < AT_BOUND:
        return "UPPER"
    return ""


def _stats(errs: list[float]) -> tuple[int, float, float]:
    a = [abs(e) for e in errs]
    return len(a), statistics.median(a), max(a)


def class_rows(runs) -> dict[str, int]:
    """Usable rows per GPU architecture class."""
    n: dict[str, int] = defaultdict(int)
    for r in runs:
        n[K.arch_class(r.gpu)] += 1
    return dict(n)


def check_classes(runs) -> None:
    """The fit fits a class's GEMM fraction (K.ETA) only where more than one row informs it, and keeps the prior of a
    class with one (K.ETA_PRIOR: one row is met exactly by any constant that moves it); a data change that moves a
    class across that line must move it in constants.py too."""
    n = class_rows(runs)
    wrong = [f"{c} ({n.get(c, 0)} rows)" for c in K.ETA if n.get(c, 0) < 2]
    wrong += [f"{c} ({n.get(c, 0)} rows)" for c in K.ETA_PRIOR if n.get(c, 0) >= 2]
    wrong += [f"{c} ({k} rows)" for c, k in n.items() if c not in K.ETA and c not in K.ETA_PRIOR]
    if wrong:
        raise SystemExit(f"constants.py ETA / ETA_PRIOR do not match the rows: {', '.join(wrong)}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=600, help="per Nelder-Mead run (RESTARTS of them)")
    ap.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md and spread.json as they are")
    ap.add_argument("--quick", action="store_true", help="CI: 5 Nelder-Mead iterations, the in-sample fit only, nothing written")
    ap.add_argument(
        "--seed-sets",
        type=int,
        default=1,
        help="refit every fold with this many sets of random starts in all (the table: the first) and report the "
        "held-out figures' range over them: how much of the headline is which valley the starts found",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="fits run side by side (processes; default: the CPUs)")
    args = ap.parse_args()
    if args.quick:
        args.iterations, args.no_write = 5, True

    runs, _ = usable_runs()
    check_classes(runs)
    sources = sorted({source_name(r.row) for r in runs})
    # ratio sources' held-out error is after each group's one fitted tokens per sample: out of the overall figures and the
    # interval, on a line of its own
    ratio = sorted(published_rows.ratio_sources(runs))
    absolute = [s for s in sources if s not in ratio]
    shipped = current()

    # Every fit below is independent of the others within its phase: `--jobs` processes run them side by side.
    # In-sample (every row in the fit: the constants to ship), each source left out, a source left out together with
    # the sources that trained the same checkpoints (the Qwen README and ms-swift: Qwen-1.8B/7B/14B-Chat, the same GPTQ
    # files and kernels; fsdp_qlora and fms-acceleration: Llama-2-70B; separate sources, but each informs the other's
    # fold through the constants they share), and
    # the same folds from other sets of random starts (the valleys are nearly flat, so the held-out figures move with
    # which one the starts find; the range over the sets says by how much: the table is the first set).
    global _RUNS
    _RUNS = runs
    models = {src: {published_rows.checkpoint(r.row) for r in runs if source_name(r.row) == src} for src in sources}
    partners_of = {src: tuple(sorted(s for s in sources if s != src and models[s] & models[src])) for src in absolute}
    calls: list[tuple] = [("fit", args.iterations, None)]
    if not args.quick:
        calls += [("fold", src, args.iterations, src, ()) for src in sources]
        calls += [("fold", src, args.iterations, src, also) for src, also in partners_of.items() if also]
        calls += [("fold", src, args.iterations, f"{src}#{k}", ()) for k in range(1, args.seed_sets) for src in sources]
    results = iter(run_jobs(calls, args.jobs))
    values, free, obj, nit = next(results)

    def report(what: str) -> None:
        lines = [f"fitted on {len(runs)} rows ({nit} iterations, objective {obj:.4f}, {what}):"]
        lines += [f"  {n} = {v:.4g}" for n, v in zip(NAMES, values)]
        print("\n".join(lines), flush=True)

    report("from the priors")
    if args.quick:
        apply(shipped)
        return 0

    folds: dict[str, tuple[list[float], list[bool]]] = {}
    fold_objective: dict[str, float] = {}
    held: dict[str, list[float]] = {}
    held_by_run: dict[int, float] = {}  # id(run) -> its held-out error
    for src in sources:
        (v, f, o, n), held[src] = next(results)
        folds[src] = (v, f)
        fold_objective[src] = o
        test = [r for r in runs if source_name(r.row) == src]
        held_by_run.update((id(r), e) for r, e in zip(test, held[src]))
        print(
            f"fold without {src}: {len(runs) - len(test)} rows, objective {o:.4f}, "
            f"held-out median {statistics.median(map(abs, held[src])):.1%}"
        )
    together: dict[str, tuple[list[str], list[float]]] = {}
    for src, also in partners_of.items():
        if also:
            together[src] = (list(also), next(results)[1])
            print(f"{src} held out with {', '.join(also)}: median {statistics.median(map(abs, together[src][1])):.1%}", flush=True)
    by_set: list[dict[str, list[float]]] = [held]
    # (seed set, source) -> that fold's (values, identified): a constant at a bound in any set is reported
    set_folds: dict[tuple[int, str], tuple[list[float], list[bool]]] = {(0, s): folds[s] for s in sources}
    for k in range(1, args.seed_sets):
        other = {}
        for src in sources:
            (v, f, _, _), other[src] = next(results)
            set_folds[k, src] = (v, f)
        by_set.append(other)
        every = [e for s, v in other.items() if s in absolute for e in v]
        print(f"seed set {k}: held-out median {statistics.median(map(abs, every)):.1%}, max {max(map(abs, every)):.1%}", flush=True)
    # The objective has more than one valley: Nelder-Mead from the priors can stop in a worse one than a
    # fold's fit found with fewer rows. The shipped constants are the best all-row fit started from the
    # priors or from any fold's constants (a warm start of the in-sample fit only: each fold's held-out
    # error above comes from its own fit, which never saw the rows it predicts).
    for src, (v, f, o, n) in zip(sources, run_jobs([("fit", args.iterations, folds[src][0]) for src in sources], args.jobs)):
        print(f"all rows, started from the fold without {src}: objective {o:.4f}", flush=True)
        if o < obj:
            values, free, obj, nit = v, f, o, n
    report("the best start")
    # Identifiability: where a fold's constant is far from the all-row value, is that the fold's rows speaking, or a flat
    # direction of its objective? Hold it at the all-row value, refit the rest, compare the objectives.
    profiled: list[str] = []
    wanted = [
        (src, i)
        for src in sources
        for i in range(len(PARAMS))
        if folds[src][1][i] and max(folds[src][0][i] / values[i], values[i] / folds[src][0][i]) >= PROFILE_SPREAD
    ]
    for (src, i), held_obj in zip(wanted, run_jobs([("profile", src, args.iterations, i, values[i]) for src, i in wanted], args.jobs)):
        own, p, v = fold_objective[src], PARAMS[i], folds[src][0]
        profiled.append(
            f"without {src}, `{p.name}` {v[i]:.3g} (all rows: {values[i]:.3g}): held at the all-row value with the other "
            f"constants refitted, the fold's objective goes from {own:.4f} to {held_obj:.4f} ({held_obj / own - 1:+.1%})"
        )
        print(profiled[-1], flush=True)
    apply(values)  # leave the shipped (all-row) fit in place for what follows
    # what bounds each row's step as the plan says it (the shipped constants): a plan looks its spread up by that
    bound_of = [
        ((predict(r).get("step_time") or {}).get("bound_by", "matmuls"), held_by_run[id(r)]) for r in runs if r.tokens_group is None
    ]
    insample = errors(runs, row_left_out=True)

    every_held = [e for s, v in held.items() if s in absolute for e in v]
    every_in = [e for s, v in insample.items() if s in absolute for e in v]
    table = [
        "| source | rows | held out: median abs error | held out: max | in-sample: median | in-sample: max |",
        "|---|---|---|---|---|---|",
    ]
    for src in sources:
        n, hm, hx = _stats(held[src])
        _, im, ix = _stats(insample[src])
        if src in absolute:
            table.append(f"| {src} | {n} | {hm:.1%} | {hx:.1%} | {im:.1%} | {ix:.1%} |")
    n, hm, hx = _stats(every_held)
    _, im, ix = _stats(every_in)
    table.append(f"| **overall** | {n} | **{hm:.1%}** | **{hx:.1%}** | {im:.1%} | {ix:.1%} |")
    for src, (partners, errs) in together.items():
        tn, thm, thx = _stats(errs)
        table.append(f"| {src}, held out with {', '.join(partners)} (the same checkpoints) | {tn} | {thm:.1%} | {thx:.1%} | | |")
    for src in ratio:
        rn, rhm, rhx = _stats(held[src])
        _, rim, rix = _stats(insample[src])
        groups = len({r.tokens_group for r in runs if source_name(r.row) == src})
        table.append(f"| {src}: ratios within {groups} groups (not in overall) | {rn} | {rhm:.1%} | {rhx:.1%} | {rim:.1%} | {rix:.1%} |")
    within_10 = sum(abs(e) <= 0.10 for e in every_held) / len(every_held)
    within_35 = sum(abs(e) <= 0.35 for e in every_held) / len(every_held)
    target = (
        f"Targets on sources outside the fit: median within 10% ({hm:.1%}: {'met' if hm <= 0.10 else 'NOT met'}), "
        f"none worse than 35% (max {hx:.1%}: {'met' if hx <= 0.35 else 'NOT met'}; {within_35:.0%} of rows within 35%, "
        f"{within_10:.0%} within 10%)."
        + "".join(
            f" Held out together with {', '.join(partners)}, which trained the same checkpoints, {src}'s rows are "
            f"{_stats(errs)[1]:.1%} median and {_stats(errs)[2]:.1%} max."
            for src, (partners, errs) in together.items()
        )
    )

    def span(pick) -> str:
        lo, hi = min(map(pick, by_set)), max(map(pick, by_set))
        return f"{lo:.1%}" if round(lo, 3) == round(hi, 3) else f"{lo:.1%}-{hi:.1%}"

    seeds = (
        f"Over {args.seed_sets} sets of the folds' random starts (the table: the first; `--seed-sets`), held out: overall "
        f"median {span(lambda h: _stats([e for s, v in h.items() if s in absolute for e in v])[1])}, max "
        f"{span(lambda h: _stats([e for s, v in h.items() if s in absolute for e in v])[2])}; "
        + "; ".join(
            f"{src}{' (ratios)' if src in ratio else ''} "
            f"{span(lambda h, s=src: _stats(h[s])[1])} / {span(lambda h, s=src: _stats(h[s])[2])}"
            for src in sources
        )
        + "."
        if args.seed_sets > 1
        else "One set of the folds' random starts (`--seed-sets N` refits the folds from N sets and reports the range)."
    )

    const = ["| constant | bounds | all rows (shipped) | " + " | ".join(f"without {s}" for s in sources) + " | spread | at a bound |"]
    const.append("|---|---|---|" + "---|" * len(sources) + "---|---|")
    flags = []
    for i, p in enumerate(PARAMS):
        cells = []
        vals = [values[i]]
        for s in sources:
            v, f = folds[s]
            cells.append(f"{v[i]:.3g}" + ("" if f[i] else " (prior: not identified)"))
            if f[i]:
                vals.append(v[i])
        flag = ", ".join(
            f"{b} in {where}"
            for where, v, f in [("all rows", values[i], free[i])] + [(f"without {s}", folds[s][0][i], folds[s][1][i]) for s in sources]
            if f and (b := at_bound(p, v))
        )
        if flag:
            flags.append(f"{p.name}: {flag}")
        const.append(
            f"| `{p.name}` | {p.lower:.3g} - {p.upper:.3g} | {values[i]:.3g} | "
            + " | ".join(cells)
            + f" | x{max(vals) / min(vals):.2f} | {flag or 'no'} |"
        )
    bounds_src = [f"- `{p.name}`: {p.why}." for p in PARAMS]
    other_sets = (
        f" The other {args.seed_sets - 1} seed set(s)' folds: "
        + (
            "; ".join(
                f"{p.name}: {b} without {src} (set {k})"
                for (k, src), (v, f) in sorted(set_folds.items())
                if k > 0
                for i, p in enumerate(PARAMS)
                if f[i] and (b := at_bound(p, v[i]))
            )
            or "none"
        )
        + "."
        if args.seed_sets > 1
        else ""
    )

    # the interval the plan prints: the held-out log-errors' 10th and 90th percentiles, overall and by
    # what bounds the step (a group of fewer than MIN_GROUP rows takes the overall spread)
    def pct(errs: list[float]) -> tuple[float, float]:
        q = statistics.quantiles(sorted(math.log1p(e) for e in errs), n=10, method="inclusive")
        return round(q[0], 4), round(q[-1], 4)

    lo, hi = pct(every_held)
    groups: dict[str, list[float]] = defaultdict(list)
    for b, e in bound_of:
        groups[b].append(e)
    by_bound = {
        b: {"rows": len(v), **dict(zip(("log_error_p10", "log_error_p90"), pct(v)))}
        for b, v in sorted(groups.items())
        if len(v) >= MIN_GROUP
    }
    interval = (
        f"The plan's time interval (gpuplan/plan/estimate/step_time/spread.json): the 10th-90th percentile of the held-out "
        f"log(plan tokens/s / measured) over {len(every_held)} rows is {lo:+.3f} .. {hi:+.3f}, so the measured time is the planned "
        f"time x {math.exp(lo):.2f} .. x {math.exp(hi):.2f} for 80% of rows on a source the fit never saw. By what bounds the "
        "step as the plan gives it with the shipped constants (groups of at least "
        + str(MIN_GROUP)
        + " rows; the rest use the overall spread): "
        + "; ".join(
            f"{b} ({g['rows']} rows) x {math.exp(g['log_error_p10']):.2f} .. x {math.exp(g['log_error_p90']):.2f}"
            for b, g in by_bound.items()
        )
        + "."
    )
    body = "\n".join(
        [
            f"{len(runs)} usable rows from {len(sources)} sources (benchmarks/published_rows.py; the rows left out, and why: see the "
            "step-time section above). Error = plan tokens/s per GPU / measured - 1. "
            "**Held out**: each source predicted by a fit made without any of its rows (the lowest objective of Nelder-Mead "
            f"from the priors and from {FOLD_STARTS} seeded random starts within the bounds). **In-sample**: the fit over every row "
            "(the constants shipped in constants.py). The objective: the mean over sources of each source's mean |log(plan / "
            "measured)|, plus a log-normal prior on each constant around its physical prior below (sigma a quarter of its "
            f"bounds' log-span, weighed {PRIOR_SCALE} / rows: one likelihood), which pulls a constant the rows cannot tell "
            "apart from another toward its measurement (it may still reach a bound: see below). "
            + (
                f"{', '.join(ratio)} published samples/s without the tokens per sample (benchmarks/published_rows.py "
                "evaluate): its rows are checked against each other, within groups that train the same samples, "
                "with each group's tokens per sample the one value that fits its plans best (at most max_length; a row's "
                "reported error takes the length fitted on the group's other rows); in a fold they weigh as any source, but "
                "their own held-out error is relative, so it stays out of the overall row, the targets and the interval."
                if ratio
                else ""
            ),
            "",
            *table,
            "",
            target,
            "",
            seeds,
            "",
            "Fitted constants: all rows, each fold, the spread across them (max / min over the fits that identify the "
            "constant), and whether any sits at its bound. A fold keeps a constant at its prior where it cannot fit it: "
            "no row of the fold depends on it, or, for `TRAINER_STEP_S`, no source of the fold sweeps the accumulation "
            "steps (a per-step cost is a per-micro-batch one at a single count: fit_step_time.py sweeps_accumulation):",
            "",
            *const,
            "",
            "At a bound: " + ("; ".join(flags) + "." if flags else "none.") + other_sets,
            "",
            "Not fitted: "
            + (
                "; ".join(
                    f"ETA[{c}] = {v:g}, its prior ({class_rows(runs).get(c, 0)} row: a class's GEMM fraction is fitted "
                    "only where more than one row informs it; one row is met exactly by any constant that moves it)"
                    for c, v in K.ETA_PRIOR.items()
                )
                + "."
                if K.ETA_PRIOR
                else "none."
            ),
            "",
            f"Fold constants at least x{PROFILE_SPREAD} from the all-row value, profiled (a small rise means the fold's rows "
            "hardly tell the two values apart: the held-out error along that direction says more about where the optimizer "
            "stopped than about the model): " + ("; ".join(profiled) + "." if profiled else "none."),
            "",
            "Where the bounds come from:",
            "",
            *bounds_src,
            "",
            interval,
        ]
    )
    print(body)
    if not args.no_write:
        write_section("fit_step_time", "Step-time fit: leave-one-source-out (the constants in constants.py)", body)
        SPREAD_JSON.write_text(
            json.dumps(
                {
                    "what": "10th and 90th percentile of log(plan tokens/s / measured) on held-out sources "
                    "(benchmarks/fit_step_time.py, leave-one-source-out over published-throughput.json)",
                    "rows": len(every_held),
                    "sources": absolute,
                    "log_error_p10": lo,
                    "log_error_p90": hi,
                    "by_bound": by_bound,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
