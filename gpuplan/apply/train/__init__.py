"""The training loop: Trainer arguments from the plan, the attempts and the out-of-memory retry,
the audit of the live run, metrics, checkpoints, interrupts, the preference trainers and the calibration record."""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "execute": "gpuplan.apply.train.execute",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
