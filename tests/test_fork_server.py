"""The fork server the tests start `gpuplan` commands from (tests/helpers/fork_server.py) gives what a
fresh `python -m gpuplan.cli` gives: the same output and exit status, the test's cwd, env and stdio,
signals delivered to the command itself. If it did not, every CLI test would prove less than it says."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import forked
from tests.helpers.cli_runs import REPO, command, env, popen, run
from tests.helpers.planning import SPECS


def _fresh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


def _forked(args: list[str], **kw) -> subprocess.CompletedProcess:
    for _ in range(2):  # the second sighting of an environment starts its server
        r = run(args, capture_output=True, text=True, timeout=120, **kw)
    assert forked._servers.get(forked._signature(kw["env"])) is not None, "no fork server served this command"
    return r


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", str(SPECS / "tiny.toml"), "--gpu", "A100-80GB"],
        ["plan", "no-such-spec.toml"],
        ["validate", str(SPECS / "tiny.toml")],
        ["--help"],
    ],
    ids=["plan", "missing-spec", "validate", "help"],
)
def test_a_forked_command_prints_and_exits_as_a_fresh_process(argv, tmp_path):
    e = env()
    fresh, fork = _fresh(command(*argv), env=e, cwd=tmp_path), _forked(command(*argv), env=e, cwd=tmp_path)
    assert (fork.returncode, fork.stdout, fork.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_the_child_runs_in_the_tests_cwd_and_env(tmp_path):
    (tmp_path / "spec.toml").write_text(
        (SPECS / "tiny.toml").read_text().replace('"models/', f'"{SPECS}/models/').replace('"data/', f'"{SPECS}/data/')
    )
    e = env()
    fork = _forked(command("plan", "spec.toml", "--json"), env=e, cwd=tmp_path)  # a path relative to the cwd
    assert fork.returncode == 0, fork.stderr
    assert '"spec_path"' in fork.stdout and str(tmp_path / "spec.toml") in fork.stdout
    debug = run(command("plan", "spec.toml"), env={**e, "GPUPLAN_DEBUG": "1"}, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert debug.returncode == 0 and forked._signature({**e, "GPUPLAN_DEBUG": "1"}) == forked._signature(e)  # read at run time


def test_signals_reach_the_command_itself(tmp_path):
    e = env()
    _forked(command("validate", str(SPECS / "tiny.toml")), env=e)  # the server is up
    for sig, expected in ((signal.SIGKILL, -signal.SIGKILL), (signal.SIGINT, 130)):
        proc = popen(command("fmt", "-"), env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert isinstance(proc, forked.ForkedPopen)
        time.sleep(0.5)  # reading stdin: it waits for us
        assert proc.poll() is None
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == expected, err  # SIGINT: the CLI's own "interrupted", exit 130
        if sig == signal.SIGINT:
            assert "interrupted" in err
    proc = popen(command("fmt", "-"), env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate('[model]\nconfig="m.json"\n', timeout=60)  # stdin is the test's pipe
    assert proc.returncode == 0 and out == '[model]\nconfig = "m.json"\n', err


def test_an_environment_read_at_import_gets_a_fresh_process():
    e = env(HF_HUB_CACHE="/nonexistent/hub")  # huggingface_hub reads it once, at import
    assert forked._signature(e) != forked._signature(env())
    assert forked.forked_popen(command("validate", str(SPECS / "tiny.toml")), env=e) is None  # first sighting
    assert forked.forked_popen([sys.executable, "-c", "pass"], env=env()) is None  # not a gpuplan command


@pytest.mark.slow
def test_loading_the_libraries_says_nothing_a_command_would_have_seen():
    """The server imports torch, transformers, peft, TRL... once; a fresh command would import them
    under notices.captured(). That is the same only while the imports warn and log nothing."""
    code = (
        "import logging, sys, warnings; seen = []\n"
        "warnings.showwarning = lambda m, c, *a, **k: seen.append(f'{c.__name__}: {m}')\n"
        "class H(logging.Handler):\n    def emit(self, r): seen.append(f'{r.name} {r.levelname}: {r.getMessage()}')\n"
        "h = H(logging.INFO); logging.getLogger().addHandler(h)\n"
        "sys.path.insert(0, sys.argv[1]); from tests.helpers import fork_server; fork_server.preload()\n"
        "print(repr(seen))\n"
    )
    r = _fresh([sys.executable, "-c", code, str(REPO)], env=env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
    assert r.stderr == "", r.stderr  # nor straight to stderr (transformers' own handler)
