"""Only gpuplan's words on the terminal: what libraries say goes to a debug log in output.dir.

The libraries that `apply`, `plan --trace`, `data` and `init` use speak on stderr through
Python's warnings (transformers' FutureWarning deprecations that peft 0.21 still
triggers) and through logging (bitsandbytes' CPU-kernel notice, transformers' loading
report, huggingface_hub). While a command runs, `captured()` routes both to
`<output.dir>/gpuplan-debug.log` (and also to stderr with GPUPLAN_DEBUG=1):
- a notice in KNOWN says nothing a user can act on in a gpuplan run: it goes to the log only;
- a notice in TRANSLATIONS matters to the run: gpuplan prints its own line with the fix,
  and the original goes to the log;
- any other warning goes to the log, and at the end gpuplan says how many there were and
  where: nothing is lost, and nothing unexplained reaches the screen.
Records wait in memory until the command knows its output dir (`log_to`); a command that
never names one gets them on stderr at the end, as the library wrote them.
Stdlib only at import: torch and transformers are imported only for commands that load them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuplan.errors import Diagnostic

DEBUG_LOG = "gpuplan-debug.log"
DEBUG_ENV = "GPUPLAN_DEBUG"
# Loggers of the libraries apply and trace import (each has its own stderr handler or
# propagates to the root logger, where bitsandbytes' records end up).
LIBRARY_LOGGERS = (
    "transformers",
    "datasets",
    "huggingface_hub",
    "accelerate",
    "peft",
    "bitsandbytes",
    "torch",
    "trl",
    "liger_kernel",
    "deepspeed",
    "filelock",
    "urllib3",
)


@dataclass(frozen=True)
class Known:
    source: str
    pattern: str  # re.search on the message
    why: str  # why it says nothing actionable about a gpuplan run


KNOWN = (
    Known(
        "bitsandbytes",
        r"Failed to load CPU gemm_4bit_forward from kernels-community",
        "bitsandbytes 0.50 tries the optional `kernels` package at import on CPUs with AVX512-BF16 "
        "(backends/cpu/ops.py) and falls back to its own kernel; it prints this even when no 4-bit layer is used",
    ),
    Known(
        "kernels",
        r"Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because Hugging Face Hub is in "
        r"offline mode",
        "the same import-time probe of bitsandbytes 0.50, asked offline: kernels 0.19 (_internals/hf_hub.py "
        "_check_trust_remote_code) says so before the probe fails and bitsandbytes falls back to its own kernel",
    ),
    Known(
        "transformers",
        r"`is_gradient_checkpointing` is deprecated",
        "peft 0.21 (peft_model.py) reads the old property name of transformers 5; nothing in the spec sets it",
    ),
    Known(
        "transformers",
        r"`gradient_checkpointing_enable` is deprecated",
        "peft's prepare_model_for_kbit_training calls the old method name; checkpointing is on as planned",
    ),
    Known("transformers", r"`gradient_checkpointing_disable` is deprecated", "as above, the old method name"),
    Known(
        "torch",
        r"torch\.utils\.checkpoint: the use_reentrant parameter should be passed explicitly",
        "transformers picks use_reentrant itself; no spec key sets it",
    ),
    Known(
        "transformers",
        r"mtime may not be reliable on this filesystem, falling back to numerical ordering",
        "checkpoints saved less than a second apart (a short run) share an mtime, so transformers orders "
        "them by step number for rotation and resume (trainer_utils.py sort_checkpoints): the right order",
    ),
    Known(
        "transformers",
        r"loss_type=None` was set in the config but it is unrecognised",
        "transformers falls back to the task's default loss, the one gpuplan plans",
    ),
)


@dataclass(frozen=True)
class Translation:
    pattern: str  # re.search on the message
    translate: Callable[[str], Diagnostic | None]


def _load_report(message: str) -> Diagnostic | None:
    """transformers 5's "LOAD REPORT" table (utils/loading_report.py) as gpuplan's warning."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", message)
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 2 and cells[1] in ("MISSING", "UNEXPECTED", "MISMATCH"):
            rows.setdefault(cells[1], []).append(cells[0])
    head = re.search(r"(\w+) LOAD REPORT\s*from: (.+)", text)
    if not rows or head is None:
        return None
    cls, path = head.group(1), head.group(2).strip()
    parts = []
    if missing := rows.get("MISSING"):
        parts.append(f"{len(missing)} weight(s) of {cls} are not in the checkpoint and start from random values ({_few(missing)})")
    if unexpected := rows.get("UNEXPECTED"):
        parts.append(f"{len(unexpected)} weight(s) in the checkpoint are not used by {cls} ({_few(unexpected)})")
    if mismatched := rows.get("MISMATCH"):
        parts.append(f"{len(mismatched)} weight(s) have another shape in the checkpoint ({_few(mismatched)})")
    return Diagnostic(
        "warning",
        "model.name_or_path",
        f"model: loading {path}: " + "; ".join(parts),
        detail="expected when the model adds a new task head (seq-cls: the classifier) or drops one "
        "(a causal LM's checkpoint loaded for another task)",
        fix="if these are not the task head, point model.name_or_path at a checkpoint of this "
        "architecture, or set model.task to the task it was trained for",
    )


def _few(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


TRANSLATIONS = (Translation(r"LOAD REPORT", _load_report),)


def known_notice(message: str) -> Known | None:
    return next((k for k in KNOWN if re.search(k.pattern, message)), None)


# Tied weights of the model being trained: a tied name -> the parameter it shares (apply/train/execute.py
# registers them). A checkpoint stores a shared tensor once, so the Trainer's resume reports the tied
# name (lm_head.weight) as missing: its check for tied keys reads _keys_to_ignore_on_save, which
# transformers 5 leaves None for Llama (trainer.py _issue_warnings_after_load), though loading the
# embedding restores both.
_tied: dict[str, str] = {}
MISSING_KEYS = re.compile(r"There were missing keys in the checkpoint model loaded: \[(.*)\]")


def tied_weights(names: dict[str, str]) -> None:
    """Register the trained model's tied parameters (tied name -> the name it shares storage with)."""
    _tied.update(names)


def tied_explanation(message: str) -> str | None:
    """gpuplan's words for a "missing keys" report that names only tied weights; None otherwise."""
    m = MISSING_KEYS.search(message)
    keys = re.findall(r"'([^']+)'", m.group(1)) if m else []
    if not keys or any(k not in _tied for k in keys):
        return None
    pairs = ", ".join(f"{k} is tied to {_tied[k]}" for k in keys)
    return f"tied embeddings: {pairs}; the checkpoint stores the shared tensor once and loading it restores both: nothing is missing"


class _Capture:
    """The records of one command: buffered until the log file is known, then appended to it."""

    def __init__(self, echo: bool, say: Callable[[Diagnostic], None]):
        self.echo, self.say = echo, say
        self.buffer: list[tuple[str, str]] = []  # (log line, the message as the library wrote it)
        self.path: str | None = None
        self.unknown = 0
        self.handler = _Handler(self)
        self.saved: dict[str, tuple[logging.Logger, list[logging.Handler], bool]] = {}

    def adopt(self, loggers: list[tuple[str, logging.Logger]]) -> None:
        """Put this capture's handler in place of each logger's own (once per logger)."""
        for name, logger in loggers:
            if name in self.saved:
                continue
            self.saved[name] = (logger, logger.handlers[:], logger.propagate)
            logger.handlers = [self.handler]
            logger.propagate = name == ""  # each record reaches the handler once

    def release(self) -> None:
        for logger, handlers, propagate in self.saved.values():
            logger.handlers, logger.propagate = handlers, propagate
        self.saved.clear()

    def record(self, source: str, level: str, message: str) -> None:
        translated = next((t.translate(message) for t in TRANSLATIONS if re.search(t.pattern, message)), None)
        if translated is not None:
            self.say(translated)
        explained = tied_explanation(message)
        if translated is None and explained is None and level in ("WARNING", "ERROR", "CRITICAL") and known_notice(message) is None:
            self.unknown += 1
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {source} {level}: {message.rstrip()}\n"
        if explained:
            line += f"  gpuplan: {explained}\n"
        if self.echo:
            sys.stderr.write(message.rstrip() + "\n")
        if self.path is None:
            self.buffer.append((line, message.rstrip() + "\n"))
        else:
            self._append([line])

    def _append(self, lines: list[str]) -> None:
        path = self.path
        assert path is not None, "appended to only once the capture has its file"
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(lines)
        except OSError as e:  # an unwritable output dir must not hide what the libraries said
            sys.stderr.write(f"gpuplan: cannot write {self.path} ({e.strerror or e}); the library messages follow\n")
            sys.stderr.writelines(lines)
            self.path = None


class _Handler(logging.Handler):
    def __init__(self, capture: _Capture):
        super().__init__(logging.INFO)
        self.capture = capture

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.capture.record(record.name, record.levelname, record.getMessage())
        except Exception:  # a logging handler never raises into the library that logged
            self.handleError(record)


_active: _Capture | None = None


def log_to(output_dir: str | None, *, load_libraries: bool = False) -> None:
    """Name the command's output dir: records go to its debug log from now on. With
    `load_libraries`, first import the libraries the command is about to use (torch,
    transformers, datasets install their own stderr handlers at import) and take them over."""
    cap = _active
    if cap is None:
        return
    if load_libraries:
        import torch  # noqa: F401  torch._logging's handlers
        import transformers.utils.logging  # noqa: F401  its library root handler

        with contextlib.suppress(ImportError):
            import datasets.utils.logging  # noqa: F401
        cap.adopt(_library_loggers())
    if output_dir is None or cap.path is not None:
        return
    cap.path = os.path.join(output_dir, DEBUG_LOG)
    lines, cap.buffer = [line for line, _ in cap.buffer], []
    if lines:
        cap._append(lines)


@contextlib.contextmanager
def captured(say: Callable[[Diagnostic], None] | None = None, *, summary: bool = True) -> Iterator[_Capture]:
    """Route warnings and library log records away from the terminal for one command; `summary`:
    end with the count of unexplained warnings (one rank of several says it)."""
    global _active
    echo = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    cap = _Capture(echo, say or _say)
    cap.adopt([("", logging.getLogger())] + _library_loggers())
    saved_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # warnings.showwarning's signature
        cap.record(category.__name__, "WARNING", warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show
    previous, _active = _active, cap
    try:
        yield cap
    finally:
        _active = previous
        warnings.showwarning = saved_show
        cap.release()
        if cap.path is None and cap.buffer and not echo:  # no output dir named: as the library would have,
            sys.stderr.writelines(raw for _, raw in cap.buffer if known_notice(raw) is None)  # less the known ones
        elif cap.unknown and summary:
            sys.stderr.write(
                f"gpuplan: {cap.unknown} library warning(s) that gpuplan does not explain are in "
                f"{cap.path} ({DEBUG_ENV}=1 shows them here)\n"
            )


def _library_loggers() -> list[tuple[str, logging.Logger]]:
    """The libraries' loggers that print themselves (own handlers or no propagation)."""
    out = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] in LIBRARY_LOGGERS and (logger.handlers or not logger.propagate):
            out.append((name, logger))
    return out


def _say(diag: Diagnostic) -> None:
    from gpuplan.render.text import render_diagnostics

    sys.stderr.write("\n".join(render_diagnostics([diag.to_dict()])) + "\n")
