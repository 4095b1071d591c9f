"""The one error type of gpuplan.modelinfo: a model config the planner cannot use."""

from __future__ import annotations

from pathlib import Path

from gpuplan.errors import OneProblem


class ModelConfigError(OneProblem, ValueError):
    """A config.json (or config mapping) that cannot be read or counted.

    `path` is the file the problem is in, or None for a mapping that did not
    come from a file; the message says what is wrong and how to fix it.
    """

    def __init__(self, path: str | Path | None, message: str) -> None:
        self.path = None if path is None else str(path)
        self.reason = message  # the problem without the path
        super().__init__(f"{self.path}: {message}" if self.path else message)
