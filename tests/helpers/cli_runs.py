"""Helpers for tests that run the real `gpuplan` CLI as a subprocess on tiny CPU specs."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODEL_CONFIG = REPO / "specs" / "models" / "tiny-llama-cpu.json"
CORPUS = REPO / "specs" / "data" / "tiny-corpus.txt"
# On the commands' PYTHONPATH after the checkout: its sitecustomize.py lets the torchrun agent and
# ranks a forked command starts be forked by the same server (inert in any other process).
BOOT = Path(__file__).resolve().with_name("boot")

SPEC = """\
[model]
config = "{config}"
from_scratch = true
task = "causal-lm"
{model_extra}
[hardware]
gpu = "cpu"

[data]
train_files = ["{corpus}"]
eval_fraction = 0.0
seq_len = {seq_len}

[training]
effective_batch_size = {batch}
learning_rate = {lr}
max_steps = {max_steps}
logging_steps = 1
save_steps = {save_steps}
save_total_limit = {keep}
seed = 0

[output]
dir = "{out}"
"""


def tiny_spec(
    path: Path,
    out: Path,
    *,
    max_steps: int = 4,
    seq_len: int = 32,
    batch: int = 4,
    lr: str = "3e-3",
    save_steps: int = 2,
    keep: int = 3,
    model_extra: str = "",
    config: Path = MODEL_CONFIG,
) -> Path:
    """Write a tiny from-scratch spec with absolute paths; returns its path."""
    path.write_text(
        SPEC.format(
            config=config,
            corpus=CORPUS,
            seq_len=seq_len,
            batch=batch,
            lr=lr,
            max_steps=max_steps,
            save_steps=save_steps,
            keep=keep,
            out=out,
            model_extra=model_extra,
        )
    )
    return path


_CHILD_TMP: list[str] = []  # this worker's temp dir for the commands it runs, made on first use


def child_tmp() -> str:
    """The TMPDIR of the commands a test runs: a folder of this worker's own (the write guard's
    OWN_TEMP prefix), so what they put in a temp dir (gpuplan eval's gpuplan-eval-*) is not in the
    system temp dir that the other worker's tests are checked against."""
    if not _CHILD_TMP:
        _CHILD_TMP.append(tempfile.mkdtemp(prefix="gpuplan-session-tmp-"))
        atexit.register(shutil.rmtree, _CHILD_TMP[0], ignore_errors=True)
    return _CHILD_TMP[0]


# What an in-process apply sets in this process's os.environ (gpuplan/apply/quiet.py), which a user's shell
# does not hold: a command started after one gets the environment it would get from the shell. (It also
# kept the test worker's fork server from serving it: datasets reads the second at import.)
IN_PROCESS_SWITCHES = {"TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
_AT_START = {k: os.environ.get(k) for k in IN_PROCESS_SWITCHES}


def env(**extra: str) -> dict[str, str]:
    """This process's environment for a gpuplan subprocess, without what a launcher around the test
    run would leave there (SLURM_*, WORLD_SIZE, MASTER_ADDR: apply would take itself for a rank) and
    without the switches an in-process apply of the test set (IN_PROCESS_SWITCHES)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("WORLD_SIZE", "MASTER_ADDR")}
    for k, v in IN_PROCESS_SWITCHES.items():
        if _AT_START[k] is None and e.get(k) == v:
            del e[k]
    e = {**e, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{BOOT}", "NO_COLOR": "1", "TMPDIR": child_tmp()}
    e.pop("GPUPLAN_TEST_INJECT_OOM", None)
    return {**e, **extra}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuplan.cli", *map(str, args)]


def gpuplan(
    *args: Any, cwd: Path | None = None, timeout: float = 180, input: str | None = None, **env_extra: str
) -> subprocess.CompletedProcess:
    """Run `gpuplan ARGS` to completion (a real process: tests/helpers/fork_server.py); stdin is not a
    terminal, and is empty unless `input` is given."""
    stdin = None if input is not None else subprocess.DEVNULL
    return run(command(*args), cwd=cwd, env=env(**env_extra), capture_output=True, text=True, timeout=timeout, stdin=stdin, input=input)


def start(*args: Any, cwd: Path | None = None, **env_extra: str) -> subprocess.Popen:
    """Start `gpuplan ARGS` and return its process (its own pid: signals reach the command)."""
    return popen(
        command(*args), cwd=cwd, env=env(**env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL
    )


def run(
    args: list[str], *, input: Any = None, timeout: float | None = None, check: bool = False, **kwargs: Any
) -> subprocess.CompletedProcess:
    """subprocess.run, with a gpuplan command started by the fork server when it can serve it."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        except BaseException:
            proc.kill()
            raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, args, out, err)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def popen(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen for `args`; a `python -m gpuplan[.cli] ...` whose import-time environment a
    fork server of this worker has (or will have from now on) is forked from it instead."""
    from tests.helpers.forked import forked_popen

    return forked_popen(args, **kwargs) or subprocess.Popen(args, **kwargs)


def state(out: Path) -> dict[str, Any]:
    return json.loads((out / "gpuplan-state.json").read_text())


def train_steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "train"]
