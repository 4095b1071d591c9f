"""apply's progress on a terminal: one line, redrawn in place, in gpuplan's words.

    step 3/4 [#####################.......]  loss 5.1234  1,234 tokens/s  0:12 left

It replaces what the libraries draw on a terminal: the Trainer's tqdm bar and the raw
`{'loss': ...}` dictionaries its ProgressCallback writes at each log (transformers
trainer_callback.py ProgressCallback.on_log), and the other tqdm bars (transformers'
"Writing model shards", datasets' maps), which apply/quiet.py turns off. Any other line
apply prints (echo) first clears the progress line and the line is drawn again after it,
so the two never share a row. Off a terminal apply prints its step lines instead (metrics.py).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

CLEAR = "\r\x1b[K"  # to the line's start, erase to its end (ECMA-48 EL)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressLine:
    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.shown = ""
        self.step = 0
        self.total: int | None = None
        self.loss: float | None = None
        self.tokens_per_second: float | None = None
        self.start: tuple[int, float] | None = None  # (step, time) when this session's training began

    # -- what the run reports ----------------------------------------------------
    def begin(self, step: int, total: int | None) -> None:
        self.step, self.total, self.start = step, total, (step, time.perf_counter())
        self.draw()

    def update(self, step: int, total: int | None, *, loss: float | None = None, tokens_per_second: float | None = None) -> None:
        self.step, self.total = step, total
        if loss is not None:
            self.loss = loss
        if tokens_per_second:
            self.tokens_per_second = tokens_per_second
        self.draw()

    def end(self) -> None:
        """Leave the last state on screen and move to a fresh line."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = ""

    def echo(self, say: Callable[[str], None]) -> Callable[[str], None]:
        """`say`, clearing the progress line first and drawing it again after the line."""

        def wrapped(line: str) -> None:
            was = self.shown
            if was:
                self.stream.write(CLEAR)
                self.stream.flush()
                self.shown = ""
            say(line)
            if was:
                self.draw()

        return wrapped

    # -- drawing -------------------------------------------------------------------
    def text(self, width: int) -> str:
        total = self.total or 0
        parts = [f"step {self.step}/{total}" if total else f"step {self.step}"]
        if total:
            bar = max(10, min(30, width // 4))
            done = min(bar, round(bar * self.step / total))
            parts[0] += f" [{'#' * done}{'.' * (bar - done)}]"
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.tokens_per_second:
            parts.append(f"{self.tokens_per_second:,.0f} tokens/s")
        left = self.time_left()
        if left is not None:
            parts.append(f"{_duration(left)} left")
        return "  ".join(parts)[: max(20, width - 1)]

    def time_left(self) -> float | None:
        if self.start is None or not self.total:
            return None
        s0, t0 = self.start
        done = self.step - s0
        if done <= 0:
            return None
        return (time.perf_counter() - t0) / done * max(0, self.total - self.step)

    def draw(self) -> None:
        line = self.text(shutil.get_terminal_size((100, 24)).columns)
        self.stream.write(CLEAR + line)
        self.stream.flush()
        self.shown = line
