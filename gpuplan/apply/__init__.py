"""apply: execute a Plan with transformers.Trainer (the only heavy part of gpuplan).

Importing this package is cheap; torch and transformers load when `execute` runs.

launch/   how the training processes start: in process, torchrun, a rank, the run lock and resume point
data/     the training data as the model sees it, and `gpuplan data`'s preview
model/    the model: loaded or built, adapters, the 4-bit base, the forward patches, generation
train/    the training loop: Trainer arguments, attempts, the audit, metrics, checkpoints, calibration
errors.py ApplyError; quiet.py the libraries' progress bars off

    from gpuplan.apply import execute, ApplyError
    results = execute(plan)            # trains, writes output.dir, returns the results
"""

from __future__ import annotations

from typing import Any

from gpuplan.apply.errors import ApplyError

__all__ = ["ApplyError", "execute"]


def __getattr__(name: str) -> Any:
    if name == "execute":
        from gpuplan.apply.train.execute import execute

        return execute
    raise AttributeError(name)
