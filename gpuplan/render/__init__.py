"""Text and JSON drawn from a plan's dict (docs/design.md principle 7: the two never drift).

render_plan(plan.to_dict(), style) -> str   (text.py)
dumps(plan.to_dict()) -> str                 (json.py: what --json prints)
render_run_state, render_drift                (state.py: gpuplan show, drift since the last apply)
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "render_diagnostics": "gpuplan.render.text",
    "render_plan": "gpuplan.render.text",
    "dumps": "gpuplan.render.json",
    "render_drift": "gpuplan.render.state",
    "render_run_state": "gpuplan.render.state",
    "Style": "gpuplan.render.style",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
