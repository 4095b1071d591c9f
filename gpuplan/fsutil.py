"""Crash-safe file writes, shared by the CLI (saved plans, fmt, init) and apply (state, markers)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def usual_mode(fd: int) -> None:
    """Give a file from mkstemp (0600) the mode a plain open() would: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Temporary file in the same directory, fsync, rename, fsync the directory.

    A reader sees the old file or the new one, never half of one, even after a kill
    or a power cut (the directory fsync makes the rename itself durable).
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        usual_mode(fd)  # mkstemp makes 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
