"""Ctrl-C during apply: save a checkpoint at the end of the step, stop, say how to resume.

The first SIGINT only sets a flag; a TrainerCallback turns it into `should_save` and
`should_training_stop` at the next step end (transformers then saves, fires on_save and
leaves the loop). A second SIGINT raises KeyboardInterrupt at once. Only in a single
process: under torchrun the ranks would stop at different steps and hang in a collective.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any


class ApplyInterrupted(Exception):
    """Training stopped on the user's request after saving `checkpoint` (exit 130)."""

    def __init__(self, step: int, checkpoint: str | None):
        self.step, self.checkpoint = step, checkpoint
        saved = f"; saved {checkpoint}" if checkpoint else ""
        super().__init__(f"interrupted at step {step}{saved}")


class GracefulStop:
    """`with stop:` around trainer.train(); `stop.callback()` goes into the Trainer's callbacks."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None
        self.active = False

    def __enter__(self) -> GracefulStop:
        single = int(os.environ.get("WORLD_SIZE", "1")) == 1
        if single and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
            self.active = True
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self._old)
            self.active = False

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nInterrupt: saving a checkpoint after this step, then stopping (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def callback(self) -> Any:
        from transformers import TrainerCallback

        stop = self

        class StopOnInterrupt(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if stop.requested:
                    control.should_save = True
                    control.should_training_stop = True

        return StopOnInterrupt()
