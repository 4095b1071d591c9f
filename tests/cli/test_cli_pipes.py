"""A closed stdout pipe (`gpuplan compare SPEC | head -1`) is a normal end: no message, the exit status
a Unix tool that SIGPIPE ends reports (141), and nothing of "internal error".

The pipe is real: its read end is closed before gpuplan starts, so the first write to stdout
meets a reader that went away, every time (what `head -1` does once it has its line)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.cli_runs import REPO, command, env

SPEC = REPO / "specs" / "tiny.toml"


def run_into_closed_pipe(*args, cwd=None) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte is written
    try:
        return subprocess.run(
            command(*args), cwd=cwd, env=env(), stdout=write, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=120
        )
    finally:
        os.close(write)


def _quiet_end(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 141, r.stderr
    assert r.stderr == "", r.stderr  # no "internal error (BrokenPipeError)", no "Exception ignored"


@pytest.mark.parametrize(
    "args",
    [
        ("compare", SPEC),
        ("compare", SPEC, "--json"),
        ("plan", SPEC),
        ("plan", SPEC, "--json"),
        ("schema",),
        ("gpus",),
    ],
    ids=lambda a: " ".join(str(x) for x in a).replace(str(SPEC), "tiny.toml"),
)
def test_a_closed_pipe_ends_quietly(args, tmp_path):
    _quiet_end(run_into_closed_pipe(*args, cwd=tmp_path))


def test_show_of_a_saved_plan_into_a_closed_pipe(tmp_path):
    saved = tmp_path / "plan.json"
    r = subprocess.run(command("plan", SPEC, "--out", saved), env=env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    _quiet_end(run_into_closed_pipe("show", saved, cwd=tmp_path))


def test_an_error_still_says_so_when_stdout_is_closed(tmp_path):
    """A user's mistake keeps its message and exit 1: only the closed pipe itself ends quietly."""
    r = run_into_closed_pipe("plan", tmp_path / "missing.toml", cwd=tmp_path)
    assert r.returncode == 1
    assert "missing.toml" in r.stderr and "internal error" not in r.stderr
