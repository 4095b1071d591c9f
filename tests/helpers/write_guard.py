"""What the suite may not write: the checkout, the user's own gpuplan files, and gpuplan's names in the
system temp dir. tests/conftest.py takes a snapshot before each test file and fails the file when one
of these places gained or changed a file by its end (module fixtures included).

Tests write only under their own temporary directories (tmp_path, tmp_path_factory); the session's
private user files, caches and probe (conftest.py: SESSION) are one such directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Folders of the checkout the tools own (the environment, byte code, the test runners' caches).
TOOL_DIRS = frozenset({".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", "build", "dist"})
# The suite's own temp folders: the session's (conftest.py) and the fork servers' sockets
# (tests/helpers/forked.py); and the CPU probe folders of an older checkout's suite running beside this one.
OWN_TEMP = ("gpuplan-session-", "gpuplan-fork-", "gpuplan-cpu-probe-")


def _files(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    if not root.is_dir():
        return out
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in TOOL_DIRS and not d.endswith(".egg-info")]
        for name in names:
            path = os.path.join(folder, name)
            try:
                out[path] = os.lstat(path).st_mtime_ns
            except OSError:
                pass
    return out


# The user's caches the suite's libraries would write without the session's XDG folders (conftest.py):
# gpuplan's own files, matplotlib's fonts, the Hugging Face hub and datasets caches, torch's hub, and Ray's
# ~/.ray (its auth token); pip's cache is the installer's, not the suite's.
USER_DIRS = (
    ".cache/gpuplan",
    ".config/gpuplan",
    ".cache/matplotlib",
    ".config/matplotlib",
    ".cache/huggingface",
    ".cache/torch",
    ".ray",
)


def _user_dirs() -> list[Path]:
    home = Path.home()
    return [home / d for d in USER_DIRS]


def _temp_names() -> dict[str, int]:
    tmp = Path(tempfile.gettempdir())
    out: dict[str, int] = {}
    for entry in os.scandir(tmp):
        if entry.name.startswith(("gpuplan", "torchinductor")) and not entry.name.startswith(OWN_TEMP):
            out[entry.path] = 0
            if entry.is_dir(follow_symlinks=False):
                out.update(_files(Path(entry.path)))
    return out


def snapshot() -> dict[str, int]:
    """path -> mtime of every file in the guarded places (folders in the temp dir by name)."""
    shot = _files(REPO)
    for d in _user_dirs():
        shot.update(_files(d))
    shot.update(_temp_names())
    return shot


def written(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The guarded paths that are new or changed between two snapshots."""
    return sorted(p for p, mtime in after.items() if before.get(p) != mtime)


def persisting(paths: list[str], wait_s: float = 10.0) -> list[str]:
    """`paths` less the temp-dir entries that disappear within `wait_s`: a TemporaryDirectory that a
    command running in the other xdist worker holds for a moment (gpuplan eval's gpuplan-eval-*) is
    removed by its owner, while a file a test left behind stays and is reported."""
    import time

    tmp = str(Path(tempfile.gettempdir())) + os.sep
    transient = [p for p in paths if p.startswith(tmp)]
    deadline = time.monotonic() + wait_s
    while transient and time.monotonic() < deadline:
        transient = [p for p in transient if os.path.lexists(p)]
        if transient:
            time.sleep(0.2)
    return sorted({p for p in paths if not p.startswith(tmp)} | set(transient))
