"""The client of tests/helpers/fork_server.py: a subprocess.Popen whose process is forked by this test
worker's pre-imported server instead of exec'd, and the pool of those servers.

`ForkedPopen` is a real `subprocess.Popen` (communicate, wait with a timeout, poll, the signals, the
context manager) in all but how the child is made: `_execute_child` hands the child's stdin, stdout
and stderr (the pipes Popen made, DEVNULL, or this process's own) to the server with the argv, cwd and
env, and `pid` is the command's own pid. The exit status is the server's waitpid status, read from
the connection, since the child is the server's and not ours.

A server serves one import-time environment: the environment minus the variables the code reads
only when it runs (tests/helpers/fork_env.py, the rule the server applies too). A command is forked
when a server for its environment is running, or when it is a torch command in the worker's own
environment (cli_runs.env()) or the second one in another (then a server is started for it; past
MAX_SERVERS per worker the least recently used one stops, the worker's own last). Anything else (a per-test Hugging Face
cache, a one-off variable, Popen options a fork cannot honour) runs as a plain subprocess.
Besides `python -m gpuplan[.cli]`, the scripts of benchmarks/ (`python SCRIPT --quick`) are served.
The torchrun agent and ranks a forked command starts are served by the same server through the boot
shim (tests/helpers/boot/sitecustomize.py; the command's environment names the server's socket in
SOCKET_VAR). GPUPLAN_TEST_FORK=0, in this process's environment or the command's, turns forking off
for that command and everything it starts.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tests.helpers.fork_env import server_env, signature, threads_applicable

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("fork_server.py")
MAX_SERVERS = 3
# Popen options a forked child cannot take; with any of them set the command is exec'd as before.
UNFORKABLE = (
    "executable",
    "preexec_fn",
    "pass_fds",
    "shell",
    "user",
    "group",
    "extra_groups",
    "umask",
    "start_new_session",
    "process_group",
)


_signature = signature  # the rule is tests/helpers/fork_env.py's
SOCKET_VAR = "GPUPLAN_TEST_FORK_SOCKET"  # tests/helpers/boot/sitecustomize.py: where torchrun's agent and ranks ask to be forked


# GPUPLAN_TEST_FORK_LOG=PATH (in the test run's environment): one JSON line per server started, with the
# seconds it took to get ready and the test that asked for it, to see what the servers cost a run.
LOG_VAR = "GPUPLAN_TEST_FORK_LOG"
_WORKER_ENV = dict(os.environ)


class _Server:
    def __init__(self, env: dict[str, str]):
        started = time.perf_counter()
        self.dir = tempfile.mkdtemp(prefix="gpuplan-fork-")
        self.path = os.path.join(self.dir, "s")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), self.path],
            env=server_env(env),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline().split()  # type: ignore[union-attr]
        # the server must have imported this checkout's gpuplan (a fresh `python -m gpuplan.cli` would)
        self.served = os.path.join(self.dir, "served.jsonl")  # what it forked (fork_server.py _log)
        self.ok = len(ready) == 2 and ready[0] == "ready" and Path(ready[1]).resolve() == (REPO / "gpuplan").resolve()
        if os.environ.get(LOG_VAR):
            own = _signature(_WORKER_ENV)  # what sets this server's environment apart from the worker's at its start
            apart = {k: env.get(k) for k in sorted({k for k, _ in _signature(env) ^ own})}
            line = {
                "test": os.environ.get("PYTEST_CURRENT_TEST"),
                "seconds": round(time.perf_counter() - started, 2),
                "ok": self.ok,
                "apart": apart,
            }
            with open(os.environ[LOG_VAR], "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: OrderedDict[frozenset, _Server] = OrderedDict()


# The commands that import torch (cli/main.py: the heavy imports are theirs): the first of them in an
# environment starts its server at once; a torch-free command is forked by a server that is running for
# its environment and never starts one (a fresh process costs it under a second, a server 10-15 s of
# imports on the 2-core machine).
NEEDS_TORCH = frozenset({"apply", "generate", "chat", "eval", "export", "data"})


# Environments other than the worker's own in which a torch command ran fresh: the second such command in one
# starts its server. A server imports more than one command does (12-15 s against about 9 s on the 2-core
# machine), so an environment a test makes for one command (a Hugging Face cache of its own) runs it fresh.
_SEEN: set[frozenset] = set()


def _own_signature() -> frozenset:
    """The import-time environment of the commands tests start with cli_runs.env(): the one most of them share."""
    from tests.helpers.cli_runs import env

    return _signature(env())


def _server_for(env: dict[str, str], argv: list[str], *, start: bool = False) -> _Server | None:
    """The running server for env's import-time environment, or one started now for a torch command in the
    worker's own environment, in one seen before, or when `start` says the environment serves several."""
    if "0" in (os.environ.get("GPUPLAN_TEST_FORK"), env.get("GPUPLAN_TEST_FORK")) or not threads_applicable(env):
        return None
    sig = _signature(env)
    server = _servers.get(sig)
    if server is not None:
        _servers.move_to_end(sig)
        return server if server.ok and server.proc.poll() is None else None
    heavy = bool(argv) and (argv[0] in NEEDS_TORCH or argv[0] == "--script" or "--trace" in argv)  # benchmark scripts import torch
    if not heavy:
        return None
    own = _own_signature()
    if not start and sig != own and sig not in _SEEN:
        _SEEN.add(sig)
        return None
    if len(_servers) >= MAX_SERVERS:  # the least recently used one goes, the worker's own last (its running children are not its)
        others = [k for k in _servers if k != own]
        _servers.pop(others[0] if others else next(iter(_servers))).close()
    _servers[sig] = server = _Server(env)
    return server if server.ok else None


def socket_for(env: dict[str, str]) -> str | None:
    """The socket of this worker's server for the `gpuplan apply` commands a process the test does not start
    itself will start under env (the workers of a Ray cluster the test runs: tests/clusters/test_ray_job.py),
    started now if none runs; None where none can serve them. Put it in their environment as SOCKET_VAR, with
    the boot shim on PYTHONPATH, and the shim asks the server to fork them (boot/sitecustomize.py)."""
    server = _server_for(env, ["apply"], start=True)
    return server.path if server is not None else None


def python_file(path: str | os.PathLike, argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """`python PATH ARGV` as a process of its own, forked from this worker's server for its environment (the
    libraries it imports already loaded) where one runs or can start, else exec'd: for a test that needs a
    separate process only to keep what the file does (a library's monkeypatches) out of the test worker."""
    args = [sys.executable, str(path), *map(str, argv)]
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    server = _server_for(env, ["--script"])
    if server is None or any(kwargs.get(k) not in (None, False) for k in UNFORKABLE):
        return subprocess.Popen(args, **kwargs)
    kwargs = {**kwargs, "env": {**env, SOCKET_VAR: server.path}, "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd())}
    return ForkedPopen(args, server=server.path, target={"path": str(Path(path).resolve()), "argv": args[2:]}, **kwargs)


@atexit.register
def _close_all() -> None:
    for server in _servers.values():
        server.close()
    _servers.clear()


def _gpuplan_module(args: list[str]) -> str | None:
    """'gpuplan.cli' for [sys.executable, '-m', 'gpuplan.cli', ...] (or gpuplan), else None."""
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and args[2] in ("gpuplan", "gpuplan.cli"):
        return args[2]
    return None


def _benchmark_script(args: list[str]) -> str | None:
    """The path of [sys.executable, SCRIPT, ...] when SCRIPT is a .py file of this checkout's benchmarks folder."""
    if len(args) >= 2 and args[0] == sys.executable and args[1].endswith(".py"):
        path = Path(args[1]).resolve()
        if path.parent == REPO / "benchmarks" and path.is_file():
            return str(path)
    return None


def forked_popen(args: list[str], **kwargs: Any) -> subprocess.Popen | None:
    """A ForkedPopen for a gpuplan command the pool can serve, else None (the caller execs it)."""
    args = [str(a) for a in args]
    module, script = _gpuplan_module(args), _benchmark_script(args)
    unforkable = any(kwargs.get(k) not in (None, False) for k in UNFORKABLE) or kwargs.get("close_fds") is False
    if (module is None and script is None) or unforkable:
        return None
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    server = _server_for(env, args[3:] if module else ["--script"])
    if server is None:
        return None
    env[SOCKET_VAR] = server.path  # the agent and ranks of a torchrun it starts are forked too
    kwargs = {**kwargs, "env": env, "cwd": os.path.abspath(kwargs.get("cwd") or os.getcwd())}
    if module is not None:
        return ForkedPopen(args, server=server.path, target={"module": module, "argv": args[3:]}, **kwargs)
    return ForkedPopen(args, server=server.path, target={"path": script, "argv": args[2:]}, **kwargs)


class ForkedPopen(subprocess.Popen):
    def __init__(self, args: list[str], *, server: str, target: dict[str, Any], **kwargs: Any):
        self._server, self._target, self._buffer = server, target, b""  # target: {module | path, argv}
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
                       p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):  # fmt: skip
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        request = json.dumps({**self._target, "cwd": os.fspath(cwd), "env": dict(env)}).encode()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(self._server)
            socket.send_fds(self._conn, [struct.pack("!Q", len(request))], fds)
            self._conn.sendall(request)
            line = self._line(block=True)
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        if not line.startswith("pid "):
            self._conn.close()
            raise OSError(f"the fork server did not start {args[2:]}")
        self.pid = int(line.split()[1])
        self._child_created = True

    def _line(self, block: bool) -> str | None:
        """The server's next line; None when not blocking and it has not come; '' when it hung up."""
        while b"\n" not in self._buffer:
            if not block and not select.select([self._conn], [], [], 0)[0]:
                return None
            data = self._conn.recv(4096)
            if not data:
                return ""
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _try_wait(self, wait_flags):
        line = self._line(block=not wait_flags & os.WNOHANG)
        if line is None:
            return (0, 0)
        self._conn.close()
        # `status S` is waitpid's own status; a server that hung up without one: exit status 255
        return (self.pid, int(line.split()[1]) if line.startswith("status ") else 255 << 8)

    def _internal_poll(self, _deadstate=None, **_):
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode
