"""`gpuplan apply` on a real terminal (a pty): gpuplan's own progress line, not the Trainer's.

The Trainer on a terminal draws a tqdm bar and writes each log as a raw dict under it
(transformers trainer_callback.py ProgressCallback.on_log: "{'loss': '5.57', ...}"), and
saving draws "Writing model shards: 100%". Off a terminal apply prints step lines instead.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import time

import pytest

from tests.helpers.cli_runs import command, env, tiny_spec

pytestmark = pytest.mark.slow


def run_on_a_terminal(args, *, cwd, timeout: float = 300, **extra) -> tuple[int, str]:
    """Run the CLI with stdin, stdout and stderr on one pty (as in a terminal); (exit code, the bytes it wrote)."""
    primary, secondary = pty.openpty()
    e = env(TERM="xterm", COLUMNS="120", **extra)
    p = subprocess.Popen(command(*args), cwd=cwd, env=e, stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the other side closed (the process ended)
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        code = p.wait(timeout=30)
    finally:
        os.close(primary)
        if p.poll() is None:
            p.kill()
    return code, out.decode("utf-8", "replace")


def screen_lines(raw: str) -> list[str]:
    """What the terminal shows at the end: each \\r redraws its line, ESC[K erases to the line's end."""
    lines = []
    for row in raw.replace("\r\n", "\n").split("\n"):
        shown = row.split("\r")[-1] if "\r" in row else row
        lines.append(re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", shown))
    return lines


def test_apply_on_a_terminal_shows_one_progress_line_in_gpuplans_words(tmp_path):
    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=3, save_steps=100)
    code, raw = run_on_a_terminal(["apply", spec, "--yes"], cwd=tmp_path, GPUPLAN_CALIBRATION_FILE=str(tmp_path / "cal.jsonl"))
    assert code == 0, raw[-3000:]
    assert "{'loss'" not in raw and "'grad_norm'" not in raw, raw[-3000:]  # the Trainer's dicts
    assert "Writing model shards" not in raw and "it/s]" not in raw, raw[-3000:]  # tqdm bars
    screen = screen_lines(raw)
    final = [line for line in screen if line.startswith("step 3/3 [")]
    assert len(final) == 1, screen  # the one progress line, left at its last state
    assert re.search(r"step 3/3 \[#+\]  loss \d+\.\d{4}  [\d,]+ tokens/s  0:\d\d left", final[0]), final[0]
    assert not any(re.match(r"step \d+/3  loss", line) for line in screen), screen  # no redirected-output step lines
    assert "final model: " in raw and "loss: " in raw, raw[-2000:]  # the summary after it, on lines of its own


def test_apply_off_a_terminal_keeps_its_step_lines(tmp_path):
    from tests.helpers.cli_runs import gpuplan

    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=2, save_steps=100)
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp_path / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert re.search(r"^step 2/2  loss \d+\.\d{4}", out, re.M), out
    assert "\r" not in out and "{'loss'" not in out
