"""`gpuplan calibration [--clear]`: the measured runs that calibrate plan times."""

from __future__ import annotations

import json

from gpuplan.cli.common import UserError


def cmd_calibration(args) -> int:
    from gpuplan.hardware.userfiles import (
        UserFileError,
        calibration_path,
        clear_calibrations,
        read_calibrations,
    )
    from gpuplan.plan.estimate.calibration import current_model

    path = calibration_path()
    try:
        if args.clear:
            n = clear_calibrations(path)
            print(f"Removed {n} measured run(s) from {path}; plans use the fitted step-time model again.")
            return 0
        records = read_calibrations(path)
    except (UserFileError, OSError) as e:
        raise UserError(str(e)) from None
    if args.json:
        print(json.dumps({"path": str(path), "runs": records}, indent=2))
        return 0
    if not records:
        print(f"No measured runs in {path}. Every completed `gpuplan apply` adds one.")
        return 0
    print(f"{len(records)} measured run(s) in {path} (newest last):")
    head = f"  {'gpu':<12} {'GPUs':>5} {'params':>8} {'tokens/s':>10} {'step s':>8} {'MFU':>6} {'util':>6}  run"
    print(head)
    for r in records:
        gpus = r.get("count", 1) * r.get("nodes", 1)
        params = r.get("n_params") or 0
        size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
        print(
            f"  {r['gpu']:<12} {gpus:>5} {size:>8} {r.get('tokens_per_second') or 0:>10,.0f} "
            f"{r.get('step_time_s') or 0:>8.3f} {r.get('mfu') or 0:>6.1%} {r['utilisation']:>6.1%}  {r.get('run')}"
            + ("" if current_model(r) else "  (not used: an earlier step-time model)")
        )
    if stale := sum(not current_model(r) for r in records):
        print(
            f"{stale} of them were measured against an earlier version of the step-time model, whose modelled step a "
            "scale is taken against: plans do not use them. An apply on that hardware records a run they use."
        )
    print(
        "A plan on the same GPU and count scales the step-time model's terms by these runs (those of its dtype, "
        "method, checkpointing and savers first); clear with: gpuplan calibration --clear"
    )
    return 0
