"""`gpuplan tune`'s experiments: a few real training steps of each candidate, on this machine.

Each candidate (plan/tune.py) is planned again as a short run (`steps` optimizer steps, no
checkpoints, its own directory under OUTPUT_DIR/tune/) and trained by apply's own
execute() (apply/train/execute.py): what runs is what apply would run, and the run's measurement is
recorded in the calibration store as every apply's is (apply/train/calibrate.py), so later plans
are calibrated by it. The measure is the run's steady rate (apply/train/metrics.py: the steps
after the first), compared with the candidate's plan. A candidate apply re-plans after
running out of memory (apply/train/oom.py) is not the candidate: it is reported, not ranked.

The results are kept in OUTPUT_DIR/tune-results.json by the candidate's fingerprint
(plan/tune.py Candidate.fingerprint) and the steps: a rerun reuses a candidate measured with
the same settings, hardware and packages instead of timing it again.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuplan.lifecycle.run_dir import TUNE_RESULTS_FILE
from gpuplan.plan.types import Plan

VERSION = 1


def read_results(output_dir: str | Path) -> dict[str, Any]:
    """{key: result} from an earlier tune of this output dir; {} when there is none or it is unreadable."""
    try:
        data = json.loads((Path(output_dir) / TUNE_RESULTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("results"), dict):
        return {}
    return data["results"]


def write_results(output_dir: str | Path, results: Mapping[str, Any]) -> None:
    from gpuplan.fsutil import write_text_atomic

    write_text_atomic(Path(output_dir) / TUNE_RESULTS_FILE, json.dumps({"version": VERSION, "results": dict(results)}, indent=1) + "\n")


def result_key(fingerprint: str, steps: int) -> str:
    return f"{fingerprint}-{steps}steps"


def short_run(
    plan: Plan, settings: Mapping[str, Any], replan: Callable[[Mapping[str, Mapping[str, Any]]], Plan], steps: int, run_dir: Path
) -> Plan:
    """The candidate's plan as a run of `steps` steps in `run_dir`, saving no checkpoint on the way."""
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in {
        **settings,
        "training.max_steps": steps,
        "training.save_steps": steps + 1,
        "training.logging_steps": 1,
        "output.dir": str(run_dir),
    }.items():
        section, name = key.split(".", 1)
        overrides.setdefault(section, {})[name] = value
    return replan(overrides)


def time_candidate(short: Plan, echo: Callable[[str], None]) -> dict[str, Any]:
    """Train the short run; what it measured (steady tokens/s and step, start-up, memory)."""
    from gpuplan.apply.train.execute import execute

    run_dir = Path(short.resolved.output.dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a candidate interrupted before: start it over
    started = time.monotonic()
    results = execute(short, echo=lambda line: None, progress=False)
    ran = {k: results.get(k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps")}
    out: dict[str, Any] = {
        "steady_tokens_per_second": results.get("steady_tokens_per_second"),
        "steady_step_time_s": results.get("steady_step_time_s"),
        "startup_s": results.get("startup_s"),
        "wall_s": time.monotonic() - started,
        "peak_memory_bytes": results.get("peak_allocated_bytes") or results.get("peak_rss_bytes"),
        "peak_memory_kind": "allocated (CUDA)" if "peak_allocated_bytes" in results else "process RSS (CPU)",
        "calibrated": "calibration" in results,
        "ran": ran,
    }
    for entry in run_dir.iterdir():  # the weights of a few steps are of no use: the state and metrics stay
        if entry.is_dir():
            shutil.rmtree(entry)
    asked = short.resolved.training.per_device_train_batch_size  # the candidate's, as its short run planned it
    if ran["per_device_train_batch_size"] != asked:
        out["error"] = f"ran out of memory: apply re-planned to per-device batch {ran['per_device_train_batch_size']} (not this candidate)"
    return out


def planned_numbers(plan: Plan) -> dict[str, Any]:
    t = plan.throughput
    return {
        "tokens_per_second": t.tokens_per_second,
        "step_time_s": t.step_time_s,
        "allocated_peak_bytes": plan.memory.allocated_peak_bytes,
        "reserved_peak_bytes": plan.memory.reserved_peak_bytes,
    }
