"""`gpuplan show OUTPUT_DIR --plot FILE.png`: draw a run to a PNG (matplotlib, optional)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuplan.cli.common import UserError
from gpuplan.fsutil import usual_mode


def write_plot(target: str, state: Mapping[str, Any], out: str) -> str:
    """Draw the run in `target` (an output dir) to `out`; returns the line to print."""
    if not Path(target).is_dir():
        raise UserError(f"--plot draws a run: give its output dir (the spec's output.dir), not {target}")
    if not out.lower().endswith(".png"):
        raise UserError(f"--plot {out}: the picture is a PNG; name the file FILE.png")
    try:
        import matplotlib  # noqa: F401  (the optional `plot` extra)
    except ImportError:
        raise UserError(
            "--plot needs matplotlib, which is not installed: pip install 'gpuplan[plot]' (or pip install matplotlib)"
        ) from None
    from gpuplan.render.plot import draw_run
    from gpuplan.render.run_metrics import read_metrics

    plan = state["plan"]
    hw = plan.get("hardware", {})
    device = "CPU" if hw.get("vendor") == "cpu" else f"{hw.get('count', 1) * hw.get('nodes', 1)} x {hw.get('name')}"
    title = (
        f"{Path(target).resolve()}: {state.get('status')}, step {state.get('progress', {}).get('global_step')}"
        f" - {plan.get('model', {}).get('model_type', '?')} on {device}"
    )
    fig = draw_run(state, read_metrics(target), title)
    dest = Path(out)
    tmp = None
    try:  # a temp file beside the target, then a rename: no half-written PNG
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".png", dir=dest.parent)
        usual_mode(fd)  # mkstemp makes 0600: the PNG gets the mode any other file would
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, dest)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    return f"Drew {target} to {out}"
