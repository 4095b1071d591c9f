"""Terminal colour, only when the stream is a terminal and NO_COLOR is unset."""

from __future__ import annotations

import os
from typing import TextIO

CODES = {"green": "32", "yellow": "33", "red": "31", "bold": "1", "dim": "2", "cyan": "36"}


class Style:
    def __init__(self, enabled: bool):
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO) -> Style:
        isatty = getattr(stream, "isatty", lambda: False)()
        return cls(bool(isatty) and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb")

    def __call__(self, text: str, *names: str) -> str:
        if not self.enabled or not names:
            return text
        return "".join(f"\033[{CODES[n]}m" for n in names) + text + "\033[0m"


PLAIN = Style(False)
