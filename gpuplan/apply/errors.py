"""The one exception `apply` raises for a mistake the user can fix."""

from __future__ import annotations


class ApplyError(Exception):
    """A user-fixable failure while applying a plan: bad file, field, weights or device.

    The message names the file or key, the bad value and the smallest fix; the CLI
    prints it without a traceback (exit code 1).
    """

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)
