"""Measured runs scale the step-time model's constants (docs/design.md: time is an estimate with a source).

Every completed `apply` records what it measured (apply/train/calibrate.py) as one line of the
calibration store (hardware/userfiles.py), with the step the plan modelled for it split into
the parts a calibration scales (plan/estimate/step_time/model.py):
    work   : device work (matmuls, attention, memory-bound, optimizer): the class's
             achievable fractions of peak and bandwidth;
    fixed  : fixed costs (kernel launches, the Trainer, DeepSpeed's ZeRO hooks): the per-kernel
             and per-step constants;
    other  : communication and offload, which the link figures price (not scaled).
A plan on the same hardware (catalog entry, GPUs per node, nodes) replaces its class's
constants by the measured ones: the work and fixed terms are multiplied by

    one run  : s = (measured step - other) / (work + fixed), both parts alike;
    two runs or more of different work/fixed mixes: s_work and s_fixed fitted by least
               squares on measured - other = s_work x work + s_fixed x fixed.

For the spec that was measured the plan's step time is then the measured one: the run's
steady step (apply/train/calibrate.py). What the run spent outside its steps (start-up: loading,
the first step's warm-up; finish: the final save) is measured apart; a plan of the same
model and key adds it to its run time (start-up + steps x step time + finish). What
changes the step (the matmul dtype, the method, checkpointing, the memory savers) is
part of the run's key: runs of this plan's key are used first; without one, the
runs of other keys are carried across THROUGH THE MODEL'S TERMS, and the assumption
says so. The terms already price what the key changes (the dtype's peak, QLoRA's
dequantization, the recompute, a saver's cost), so a 300 tokens/s fp32 run scales
the fp32 plan's terms, not a bf16 plan's peak 16x larger. Records written before the
step-time model (no modelled parts), or under an earlier version of it (STEP_MODEL), are not
used: their modelled parts are not what today's model prices, so the scale they give would not
land the measured spec on its measured step. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuplan.hardware.profile import GPUProfile
from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.model import WORK_KINDS

# The version of the step-time model a record's modelled parts were priced with (the record's "step_model"; none:
# 1). Bumped when a change moves the parts a run's own plan is made of by more than a refit's few percent, with the
# architecture classes (step_time/constants.py arch_class, the record's "arch_class") whose parts it moved: a record
# of an earlier version on such a class is not set against a model it was not measured against; one on another
# class still is. 2: a CPU prices the Trainer's per-step work at its measurement (3.2 ms), not at the GPU fit's
# 0.1 s, which was half a tiny CPU run's modelled step. 3: the refit on ms-swift's rows moves every class: the GPU
# Trainer's per-step cost falls from 0.1 s to 1.6 ms, the per-kernel cost rises 23%, and the GEMM half-saturation
# (a CPU's too) goes from 267 to 357 tokens (benchmarks/RESULTS.md, "Step-time fit"). 4: the refit with
# fms-acceleration's rows and the constants' priors in the objective moves every class again: the A100's GEMM fraction
# 0.720 -> 0.649, Ada's 0.80 -> 0.88, the half-saturation (a CPU's too) 357 -> 257 tokens, the GPU Trainer's step
# 1.6 -> 3.7 ms.
STEP_MODEL_CHANGES: dict[int, frozenset[str]] = {
    2: frozenset({"cpu"}),
    3: frozenset({*K.ETA, *K.ETA_PRIOR, *K.BORROWED, "cpu"}),
    4: frozenset({*K.ETA, *K.ETA_PRIOR, *K.BORROWED, "cpu"}),
    # eager Llama layers' traced elementwise bytes and the LoRA adapter path's (issue 31), refit: every class
    5: frozenset({*K.ETA, *K.ETA_PRIOR, *K.BORROWED, "cpu"}),
    # a frozen base's traced backward bytes, pinned host copies at HOST_COPY_FRACTION, FSDP's offload copies per
    # unshard (issue 31), refit: every class
    6: frozenset({*K.ETA, *K.ETA_PRIOR, *K.BORROWED, "cpu"}),
    # Ada's GEMM fraction at its prior (one published row: constants.py ETA_PRIOR), refit without it: every class
    7: frozenset({*K.ETA, *K.ETA_PRIOR, *K.BORROWED, "cpu"}),
}
STEP_MODEL = max(STEP_MODEL_CHANGES)
WORK_GROUPS = ("matmuls", "attention", "memory-bound", "optimizer")
FIXED_GROUPS = ("fixed costs",)


def calibration_key(dtype: str, method: str, checkpointing: bool, savers: Iterable[str]) -> dict[str, Any]:
    return {"dtype": dtype, "method": method, "gradient_checkpointing": bool(checkpointing), "savers": sorted(savers)}


def modelled_parts(step_time: Mapping[str, Any]) -> dict[str, float]:
    """The step's exposed seconds as work / fixed / other, without any calibration scale.

    A term is in the part that step_time/model.py's scaled_term multiplies: `work` its device
    terms, `fixed` its fixed costs, `other` the rest (communication, offload, and the optimizer's
    serial passes over the states, which a scale leaves alone). Split by group instead, the
    optimizer's terms were divided by the work scale here and not multiplied by it there, and a
    calibrated plan missed its own run (by 25% at a work scale of 0.16)."""
    scale = step_time.get("scale") or {}
    parts = {"work": 0.0, "fixed": 0.0, "other": 0.0}
    for t in step_time["terms"]:
        kind = t.get("kind")
        if kind is None:  # a record written before terms had kinds: by group, as then
            part = "work" if t["group"] in WORK_GROUPS else "fixed" if t["group"] in FIXED_GROUPS else "other"
        else:
            part = "work" if kind in WORK_KINDS else "fixed" if t["group"] in FIXED_GROUPS else "other"
        parts[part] += t["exposed_s"] / (scale.get(part, 1.0) if part != "other" else 1.0)
    return parts


def current_model(record: Mapping[str, Any]) -> bool:
    """Whether a record's modelled parts are what this version of the step-time model prices (STEP_MODEL): none of the
    changes since its version moved its class's parts (a record that names no class is taken as moved)."""
    if not isinstance(record.get("modelled_s"), Mapping):
        return False
    since = record.get("step_model", 1)
    cls = record.get("arch_class")
    return not any(cls is None or cls in moved for version, moved in STEP_MODEL_CHANGES.items() if version > since)


def matching_runs(records: Sequence[Mapping[str, Any]], gpu: str, count: int, nodes: int) -> list[Mapping[str, Any]]:
    return [
        r
        for r in records
        if r.get("gpu") == gpu and r.get("count") == count and r.get("nodes", 1) == nodes and current_model(r) and r.get("step_time_s")
    ]


def _step(run: Mapping[str, Any]) -> float:
    """The measured step without the slowdowns the plan models on top of the terms (the cache
    emptying of training.torch_empty_cache_steps): the calibrated plan applies them again."""
    return run["step_time_s"] / (run.get("slowdown") or 1.0)


def _fit(runs: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """(s_work, s_fixed) by least squares over runs of different mixes; None when singular."""
    pts = [(r["modelled_s"]["work"], r["modelled_s"]["fixed"], _step(r) - r["modelled_s"]["other"]) for r in runs]
    a = sum(w * w for w, _, _ in pts)
    b = sum(w * f for w, f, _ in pts)
    c = sum(f * f for _, f, _ in pts)
    det = a * c - b * b
    if len(pts) < 2 or det <= 1e-12 * max(a * c, 1e-30):
        return None
    yw = sum(w * y for w, _, y in pts)
    yf = sum(f * y for _, f, y in pts)
    sw, sf = (c * yw - b * yf) / det, (a * yf - b * yw) / det
    if sw <= 0 or sf <= 0:
        return None
    return {"work": sw, "fixed": sf}


def calibrated_scale(
    records: Sequence[Mapping[str, Any]],
    gpu: GPUProfile,
    count: int,
    nodes: int,
    *,
    key: Mapping[str, Any],
    modelled: Mapping[str, float],
    n_params: int | None = None,
) -> tuple[dict[str, float], dict[str, Any]] | None:
    """(the scale of the work and fixed terms, the `throughput.calibration` section), or None.

    The section's `startup_s` is the newest run's measured start-up plus finish when that run
    trained this model (`n_params`) with this key, else None (another model loads in another time)."""
    runs = matching_runs(records, gpu.name, count, nodes)
    if not runs:
        return None
    same = [r for r in runs if r.get("key") == dict(key)]
    used = same or runs
    carried = [] if same else _differences(used[-1].get("key") or {}, key)
    scale = _fit(used)
    latest = used[-1]
    if scale is None:  # one run, or runs of one mix: a single scale of both parts
        y = sum(_step(r) - r["modelled_s"]["other"] for r in used)
        x = sum(r["modelled_s"]["work"] + r["modelled_s"]["fixed"] for r in used)
        s = max(y / max(x, 1e-12), 1e-3)
        scale = {"work": s, "fixed": s}
    section = {
        "run": latest.get("run"),
        "finished_at": latest.get("finished_at"),
        "spec_path": latest.get("spec_path"),
        "measured": {
            k: latest.get(k)
            for k in (
                "tokens_per_second",
                "rate",
                "step_time_s",
                "startup_s",
                "finish_s",
                "mfu",
                "utilisation",
                "flops_per_token",
                "n_params",
                "peak_memory_bytes",
            )
        },
        "startup_s": _startup(latest) if same and n_params is not None and latest.get("n_params") == n_params else None,
        "scale": scale,
        "runs_used": len(used),
        "runs_on_this_hardware": len(runs),
        "same_key": bool(same),
        "carried_across": carried,
        "modelled_before": dict(modelled),
    }
    return scale, section


def _startup(run: Mapping[str, Any]) -> float | None:
    if run.get("startup_s") is None:
        return None
    return run["startup_s"] + (run.get("finish_s") or 0.0)


def _differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    return [f"{k} {theirs.get(k)!r} -> {ours.get(k)!r}" for k in ours if theirs.get(k) != ours.get(k)]


def calibration_assumption(section: Mapping[str, Any]) -> str:
    m, s = section["measured"], section["scale"]
    how = (
        f"work x {s['work']:.2f}, fixed costs x {s['fixed']:.2f}"
        if abs(s["work"] - s["fixed"]) > 1e-9
        else f"the model's terms x {s['work']:.2f}"
    )
    over = (
        f"fitted over {section['runs_used']} measured runs"
        if section["runs_used"] > 1
        else f"measured {m['tokens_per_second']:,.0f} tokens/s in {section['run']}"
    )
    carried = ""
    if section["carried_across"]:
        carried = "; carried across " + ", ".join(section["carried_across"]) + " through the model's terms"
    if section.get("startup_s") is not None:
        carried += f"; the run time adds its measured {section['startup_s']:.1f} s of start-up and final save"
    return f"step-time model, calibrated on this hardware: {how} ({over}){carried}"
