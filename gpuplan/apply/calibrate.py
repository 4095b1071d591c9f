"""What a finished run measured, as a calibration record (plan/estimate/calibration.py reads it).

    utilisation = FLOPs per token (executed, recomputation included) x tokens/s x
                  (1 + the plan's modelled slowdowns) / (GPUs x dense peak of the dtype)
    MFU         = model FLOPs per token x tokens/s / (GPUs x dense peak)   (PaLM appendix B)

The slowdowns the plan models on top of the FLOPs (cache emptying) are divided out so a
calibrated plan, which applies them again, lands on the measured step time. Tokens/s is
the whole training loop's (first step, logging, evaluation and checkpoints included):
what a run of that length really takes. Imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpuplan.plan.estimate.calibration import calibration_key, modelled_parts
from gpuplan.plan.types import Plan


def calibration_record(plan: Plan, results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The record of a completed run, or None when it measured no throughput or has no peak."""
    t, hw = plan.throughput, plan.hardware
    tps = results.get("tokens_per_second")
    peak = t.peak_tflops
    if not tps or not peak or not t.flops_per_token or not t.tokens_per_step:
        return None
    world = hw.world_size
    slowdown = 1.0
    for fraction in (t.slowdowns or {}).values():
        slowdown *= 1 + fraction
    capacity = world * peak * 1e12
    utilisation = t.flops_per_token * tps * slowdown / capacity
    if not 0 < utilisation <= 1:
        return None  # a measurement past the peak means the peak is wrong: not used
    peak_memory = results.get("peak_allocated_bytes", results.get("peak_rss_bytes"))
    model = {}
    if t.step_time:  # the parts a later plan scales (plan/estimate/calibration.py), and what changes the step
        model = {
            "modelled_s": modelled_parts(t.step_time),
            "key": calibration_key(
                t.peak_dtype or "fp32",  # the key plan/build.py looks calibrations up by
                plan.resolved.model.method.name,
                plan.resolved.training.gradient_checkpointing,
                [s.name for s in plan.memory.savers],
            ),
            "arch_class": t.step_time.get("arch_class"),
        }
    return {
        "run": plan.resolved.output.dir,
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "spec_path": plan.spec_path,
        "spec_sha256": plan.spec_sha256,
        "gpu": hw.name,
        "count": hw.count,
        "nodes": hw.nodes,
        "n_params": plan.model.n_params,
        "seq_len": plan.resolved.data.seq_len,
        "per_device_train_batch_size": results.get("per_device_train_batch_size"),
        "tokens_per_step": t.tokens_per_step,
        "tokens_per_second": tps,
        "step_time_s": t.tokens_per_step / tps,
        "flops_per_token": t.flops_per_token,
        "model_flops_per_token": t.model_flops_per_token,
        "peak_dtype": t.peak_dtype,
        "peak_tflops": peak,
        "utilisation": utilisation,
        "mfu": (t.model_flops_per_token or t.flops_per_token) * tps / capacity,
        "plan_utilisation": t.utilisation,
        "plan_step_time_s": t.step_time_s,
        "peak_memory_bytes": peak_memory,
        "peak_memory_kind": "allocated (CUDA)" if "peak_allocated_bytes" in results else "process RSS (CPU)",
        **model,
    }


def record_measurement(plan: Plan, results: dict[str, Any], echo) -> None:
    """Put the record in the run's results and append it to the user's calibration store."""
    from gpuplan.userfiles import append_calibration

    record = calibration_record(plan, results)
    if record is None:
        return
    results["calibration"] = record
    try:
        path = append_calibration(record)
    except OSError as e:  # the run succeeded; only the cache could not be written
        echo(f"note: could not record the measured throughput for later plans ({e.strerror or e})")
        return
    results["calibration_store"] = str(path)
