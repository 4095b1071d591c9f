"""The fork server the tests start `gpuplan` commands from (tests/helpers/fork_server.py) gives what a
fresh `python -m gpuplan.cli` gives: the same output and exit status, the test's cwd, env and stdio,
signals delivered to the command itself. If it did not, every CLI test would prove less than it says."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuplan.render.notices import known_notice
from tests.helpers import forked
from tests.helpers.cli_runs import REPO, command, env, popen, run
from tests.helpers.planning import SPECS


def _fresh(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)


def _forked(args: list[str], **kw) -> subprocess.CompletedProcess:
    forked._server_for(kw["env"], ["apply"], start=True)  # a torch command starts a server; a torch-free one never does
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


def test_pythonpath_counts_without_the_boot_shim_and_the_checkout_gpuplan_is_installed_from(tmp_path):
    from tests.helpers import fork_env

    bare = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    assert fork_env.BOOT in fork_env.SERVED_PATHS
    with_shim = {**bare, "PYTHONPATH": f"{REPO}{os.pathsep}{fork_env.BOOT}"}
    same = fork_env.signature(with_shim) == fork_env.signature(bare)
    assert same == (str(REPO) in fork_env.SERVED_PATHS)
    # the checkout is served exactly where a process without it on its path imports gpuplan from it anyway
    where = _fresh([sys.executable, "-c", "import gpuplan; print(gpuplan.__file__)"], env=bare, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert (Path(where.stdout.strip()).resolve() == (REPO / "gpuplan" / "__init__.py").resolve()) == same
    stand_ins = {**with_shim, "PYTHONPATH": f"{tmp_path}{os.pathsep}{with_shim['PYTHONPATH']}"}
    assert fork_env.signature(stand_ins) != fork_env.signature(with_shim)  # a folder that may shadow a loaded module


@pytest.mark.parametrize("server_path", ["", "shim"], ids=["server-bare", "server-with-shim"])
def test_a_childs_sys_path_is_the_one_a_fresh_interpreter_builds_from_its_pythonpath(tmp_path, server_path):
    """fork_server.child_path, computed in a process started as a server is (a script, its own PYTHONPATH),
    equals the sys.path of a fresh `python -m MODULE` under the command's PYTHONPATH and cwd, for each
    PYTHONPATH the suite's commands carry and one with a folder of its own."""
    from tests.helpers import fork_env

    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "showpath.py").write_text("import json, sys; print(json.dumps(sys.path))\n")
    probe = tmp_path / "probe.py"  # loads fork_server.py from its file, leaving sys.path as the server's is
    probe.write_text(
        "import importlib.util, json, sys\n"
        "def load(name, path):\n"
        "    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)\n"
        "    sys.modules[name] = m; spec.loader.exec_module(m); return m\n"
        f"load('fork_env', {str(REPO / 'tests/helpers/fork_env.py')!r})\n"
        f"server = load('fork_server', {str(REPO / 'tests/helpers/fork_server.py')!r})\n"
        "print(json.dumps(server.child_path(sys.argv[1], json.loads(sys.argv[2]), sys.argv[1])))\n"
    )
    base = {k: v for k, v in env().items() if k != "PYTHONPATH"}
    server_env = {**base, **({"PYTHONPATH": f"{REPO}{os.pathsep}{fork_env.BOOT}"} if server_path else {})}
    for command_path in ("", f"{REPO}{os.pathsep}{fork_env.BOOT}", f"{tmp_path / 'stand-ins'}{os.pathsep}{fork_env.BOOT}"):
        command_env = {**base, **({"PYTHONPATH": command_path} if command_path else {})}
        fresh = _fresh([sys.executable, "-m", "showpath"], env=command_env, cwd=cwd)
        assert fresh.returncode == 0, fresh.stderr
        got = _fresh([sys.executable, str(probe), str(cwd), json.dumps(command_env)], env=server_env, cwd=tmp_path)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == json.loads(fresh.stdout), command_path


def test_ray_workers_and_unbuffered_stdio_keep_the_server_a_command_is_served_by():
    """A Ray worker's own variables, and Ray's settings a test gives its cluster, are read by no library at
    import (fork_env.IMPORT_FREE, RAY_* by prefix), nor is a shell's prompt; PYTHONUNBUFFERED only sets the
    interpreter's stdio, which the child rebuilds unbuffered as `-u` does."""
    from tests.helpers import fork_env

    ray = {"RAY_RAYLET_PID": "1", "RAY_JOB_ID": "01000000", "RAY_CLIENT_MODE": "0", "SPT_NOENV": "1", "PYTHONBREAKPOINT": "0"}
    ray |= {"RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "PS1": "(.venv) "}
    assert forked._signature(env(**ray, PYTHONUNBUFFERED="1")) == forked._signature(env())
    assert fork_env.unbuffered(env(PYTHONUNBUFFERED="1")) and not fork_env.unbuffered(env(PYTHONUNBUFFERED=""))


def test_an_environment_read_at_import_gets_a_fresh_process():
    e = env(HF_HUB_CACHE="/nonexistent/hub")  # huggingface_hub reads it once, at import
    assert forked._signature(e) != forked._signature(env())
    assert forked.forked_popen(command("validate", str(SPECS / "tiny.toml")), env=e) is None  # first sighting
    assert forked.forked_popen([sys.executable, "-c", "pass"], env=env()) is None  # not a gpuplan command


@pytest.mark.slow
def test_loading_the_libraries_says_nothing_a_command_would_have_seen():
    """The server imports torch, transformers, peft, TRL... once; a fresh command would import them
    under notices.captured(). That is the same only while the imports warn and log nothing a user could
    see: the one exception is a notice in gpuplan.render.notices.KNOWN, which a fresh command sends to its
    debug log only (bitsandbytes 0.50 on a CPU with AVX512-BF16 logs one at import; a forked child's debug
    log lacks that line, and nothing on its screen differs)."""
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
    seen = ast.literal_eval(r.stdout.strip())
    assert [m for m in seen if known_notice(m) is None] == [], seen
    assert r.stderr == "", r.stderr  # nor straight to stderr (transformers' own handler)


# torchrun's agent and ranks, forked by the boot shim (tests/helpers/boot/sitecustomize.py)


def test_the_shim_serves_the_module_apply_launches_on_every_rank(tmp_path):
    """The rank module is named once in the shim; if apply launched another, the ranks would quietly
    go back to fresh 9-second interpreters."""
    from gpuplan.apply.launch.torchrun import launch_command
    from tests.helpers.apply_plans import cpu_plan
    from tests.helpers.boot import sitecustomize as boot

    plan = cpu_plan(tmp_path, **{"hardware.count": 2, "distributed.strategy": "ddp"})
    argv = launch_command(plan, str(tmp_path / "plan.json"), node_rank=0, env={}, python=sys.executable)
    target = boot._target(argv)
    assert target is not None and target[0]["module"] == "torch.distributed.run"
    module = argv[argv.index("-m", 2) + 1]
    assert boot._target([sys.executable, "-u", "-m", module, "plan.json"]) == ({"module": boot.RANK_MODULE, "argv": ["plan.json"]}, True)
    assert boot.SOCKET_VAR == forked.SOCKET_VAR
    assert boot._target([sys.executable, "-X", "dev", "-m", module]) is None  # an option the child would not have


def test_the_shim_serves_gpuplan_and_the_benchmark_scripts_a_benchmark_starts():
    """benchmarks/time_accuracy.py runs `python -m gpuplan apply`, gpu_check.py and apply_overhead.py run
    themselves again: served too, and nothing outside benchmarks/ by path."""
    from tests.helpers.boot import sitecustomize as boot

    repo = Path(__file__).resolve().parents[1]
    assert boot._target([sys.executable, "-m", "gpuplan", "plan", "x.toml"]) == ({"module": "gpuplan", "argv": ["plan", "x.toml"]}, False)
    script = repo / "benchmarks" / "gpu_check.py"
    assert boot._target([sys.executable, str(script), "--run-case", "{}"]) == ({"path": str(script), "argv": ["--run-case", "{}"]}, False)
    assert boot._target([sys.executable, str(repo / "tests" / "conftest.py")]) is None
    assert boot._target([sys.executable, str(repo / "benchmarks" / "no-such.py")]) is None
    assert boot._target([sys.executable, "-m", "pytest"]) is None


def _torchrun(*worker_args: str) -> list[str]:
    from tests.helpers.boot.sitecustomize import RANK_MODULE

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        "-m",
        RANK_MODULE,
        *worker_args,
    ]


def _served(server) -> list[dict]:
    import json
    import os

    return [json.loads(line) for line in open(server.served)] if os.path.exists(server.served) else []


def _root_cause(stderr: str) -> str:
    """The exit code torchrun's report gives for the first rank that failed."""
    m = re.search(r"Root Cause.*?exitcode\s*:\s*(-?\d+)", stderr, re.S)
    assert m, stderr[-3000:]
    return m.group(1)


@pytest.mark.slow
def test_torchruns_agent_and_ranks_are_forked_and_a_failing_rank_fails_the_run_as_fresh_ones_do(tmp_path):
    """Each rank exits 2 (the worker's usage error: no plan); torchrun reports it and exits 1, the
    same with fresh interpreters and with the shim, whose log shows the agent and both ranks forked."""
    e = env()
    server = forked._server_for(e, ["apply"])
    assert server is not None
    start = len(_served(server))
    proc = subprocess.Popen(
        _torchrun(), env={**e, forked.SOCKET_VAR: server.path}, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=180)
    fresh = _fresh(_torchrun(), env=e, cwd=tmp_path)
    assert proc.returncode == fresh.returncode == 1, err[-3000:]
    assert _root_cause(err) == _root_cause(fresh.stderr) == "2"
    assert "the following arguments are required: plan" in err and "the following arguments are required: plan" in fresh.stderr
    served = _served(server)[start:]
    agent = [s for s in served if s["module"] == "torch.distributed.run"]
    ranks = [s for s in served if s["module"] != "torch.distributed.run"]
    assert [s["client"] for s in agent] == [proc.pid], served  # the agent is the process we started, forked
    assert len(ranks) == 2, served
    # the pids torchrun reports for the failed ranks are the shims it started, whose commands were forked
    reported = {int(p) for p in re.findall(r"exitcode\s*:\s*2 \(pid: (\d+)\)", err)}
    assert reported and reported <= {s["client"] for s in ranks}, err[-3000:]


@pytest.mark.slow
def test_a_rank_whose_shim_is_killed_dies_with_it_and_fails_the_run(tmp_path):
    """SIGKILL reaches only the shim (torchrun's last resort); the server then kills the forked rank,
    and torchrun reports the rank killed by SIGKILL, as for a fresh rank."""
    import os

    e = env()
    server = forked._server_for(e, ["apply"])
    assert server is not None
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)  # each rank blocks opening it: alive until killed
    start = len(_served(server))
    proc = subprocess.Popen(
        _torchrun(str(fifo)),
        env={**e, forked.SOCKET_VAR: server.path},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(ranks := [s for s in _served(server)[start:] if s["module"] != "torch.distributed.run"]) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, _served(server)[start:]
            time.sleep(0.2)
        victim = ranks[0]
        os.kill(victim["client"], signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
        gone = time.monotonic() + 10
        while _alive(victim["pid"]) and time.monotonic() < gone:
            time.sleep(0.1)
        assert not _alive(victim["pid"]), "the forked rank outlived its shim"
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(OSError):  # a rank still opening the plan reads nothing and exits
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert proc.returncode == 1, err[-3000:]
    assert "SIGKILL" in err and f"pid: {victim['client']}" in err, err[-3000:]


def _alive(pid: int) -> bool:
    """The process exists (the server's watcher reaps its own children, so a dead one is gone)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
