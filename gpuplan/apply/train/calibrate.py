"""What a finished run measured, as a calibration record (plan/estimate/calibration.py reads it).

    utilisation = FLOPs per token (executed, recomputation included) x tokens/s x
                  (1 + the plan's modelled slowdowns) / (GPUs x dense peak of the dtype)
    MFU         = model FLOPs per token x tokens/s / (GPUs x dense peak)   (PaLM appendix B)

The slowdowns the plan models on top of the FLOPs (cache emptying) are divided out so a
calibrated plan, which applies them again, lands on the measured step time. The step time is
the STEADY one (apply/train/metrics.py: the steps after the first, logging, evaluation and
checkpoints between them included); what the run spends outside its steps is recorded apart:
    startup_s : apply's start to the first step's end, less one steady step (model and data
                loading, building the Trainer, the first step's compilation and warm-up)
    finish_s  : the last step's end to the results (the final save)
so the run time is startup_s + steps x step_time_s + finish_s (a calibrated plan's is too:
plan/build.py). A run of one step has no steady rate: its whole loop's is recorded, and says so.

A run faster than the peak (utilisation > 1) is recorded too, with `above_peak` and a note: on a
CPU the peak is probed (hardware/cpu_probe.py), and a probe taken while the machine was busy reads
low; the calibrated plan uses the measured step time, not the peak. Imports neither torch nor
transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpuplan.plan.estimate.calibration import STEP_MODEL, calibration_key, modelled_parts
from gpuplan.plan.types import Plan


def calibration_record(plan: Plan, results: Mapping[str, Any]) -> dict[str, Any] | None:
    """The record of a completed run, or None when it measured no throughput or has no peak."""
    t, hw = plan.throughput, plan.hardware
    steady = results.get("steady_tokens_per_second")
    tps = steady or results.get("tokens_per_second")
    peak = t.peak_tflops
    if not tps or not peak or not t.flops_per_token or not t.tokens_per_step:
        return None
    world = hw.world_size
    slowdown = 1.0
    for fraction in (t.slowdowns or {}).values():
        slowdown *= 1 + fraction
    capacity = world * peak * 1e12
    utilisation = t.flops_per_token * tps * slowdown / capacity
    if utilisation <= 0:
        return None
    peak_memory = results.get("peak_allocated_bytes", results.get("peak_rss_bytes"))
    model = {}
    if t.step_time:  # the parts a later plan scales (plan/estimate/calibration.py), and what changes the step
        model = {
            "modelled_s": modelled_parts(t.step_time),
            "step_model": STEP_MODEL,
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
        "rate": "steady (after the first step)" if steady else "whole loop (no step after the first)",
        "step_time_s": results.get("steady_step_time_s") if steady and results.get("steady_step_time_s") else t.tokens_per_step / tps,
        "slowdown": slowdown,  # the plan's modelled slowdowns, in the step time: plan/estimate/calibration.py divides them out
        "steps": (results.get("global_step") or 0) - (results.get("start_step") or 0),
        "startup_s": results.get("startup_s") if steady else None,
        "finish_s": results.get("finish_s") if steady else None,
        "runtime_s": results.get("runtime_s"),
        "flops_per_token": t.flops_per_token,
        "model_flops_per_token": t.model_flops_per_token,
        "peak_dtype": t.peak_dtype,
        "peak_tflops": peak,
        "utilisation": utilisation,
        "above_peak": utilisation > 1,
        "mfu": (t.model_flops_per_token or t.flops_per_token) * tps / capacity,
        "plan_utilisation": t.utilisation,
        "plan_step_time_s": t.step_time_s,
        "peak_memory_bytes": peak_memory,
        "peak_memory_kind": "allocated (CUDA)" if "peak_allocated_bytes" in results else "process RSS (CPU)",
        **model,
    }


def record_measurement(plan: Plan, results: dict[str, Any], echo) -> None:
    """Put the record in the run's results and append it to the user's calibration store."""
    from gpuplan.hardware.userfiles import append_calibration

    record = calibration_record(plan, results)
    if record is None:
        return
    if record["above_peak"]:
        echo(above_peak_note(record))
    results["calibration"] = record
    try:
        path = append_calibration(record)
    except OSError as e:  # the run succeeded; only the cache could not be written
        echo(f"note: could not record the measured throughput for later plans ({e.strerror or e})")
        return
    results["calibration_store"] = str(path)


def above_peak_note(record: Mapping[str, Any]) -> str:
    """What a run faster than its peak says: recorded, and where the peak came from."""
    peak = f"{record['peak_tflops']:.3g} TFLOP/s {record.get('peak_dtype') or 'fp32'}"
    where = f"the catalog's dense peak ({peak})"
    fix = "check the GPU's entry in the catalog (gpuplan/hardware/catalog.toml)"
    if record.get("gpu") == "cpu":
        from gpuplan.hardware.cpu_probe import probe_path

        where = f"the probed CPU peak ({peak}; a probe taken while the machine was busy reads low)"
        fix = f"to probe again, delete {probe_path()}: the next plan measures the CPU anew"
    return (
        f"note: the run reached {record['utilisation']:.0%} of {where}; recorded anyway, "
        f"later plans use its measured step time, not the peak; {fix}"
    )
