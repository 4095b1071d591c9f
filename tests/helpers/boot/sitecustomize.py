"""Serve torchrun's agent and ranks from the test worker's fork server (tests/helpers/fork_server.py).

`gpuplan apply` of a multi-process plan starts `python -m torch.distributed.run ... -m RANK_MODULE
PLAN.json` (gpuplan/apply/launch/torchrun.py), and the agent starts each rank as `python -u -m RANK_MODULE ...`
(torch/distributed/run.py, config_from_args): fresh interpreters that each pay about 9 s of imports.
The tests put this folder on PYTHONPATH (tests/helpers/cli_runs.py env()) and, for a command the
fork server runs, its socket in SOCKET_VAR (tests/helpers/forked.py), so every Python process that
command starts imports this module at start-up (site.py), before anything else is imported.

The same goes for the `gpuplan` commands and the benchmarks/ scripts that a forked command starts in turn
(`python -m gpuplan apply ...` from benchmarks/time_accuracy.py, `python benchmarks/gpu_check.py --run-case`
from its own CPU mode, `python benchmarks/apply_overhead.py --one ...`): the fork server serves those as it
serves a test's own (tests/helpers/forked.py), so a benchmark's quick run does not pay the imports again.

In a process whose command line (sys.orig_argv) is one of SERVED_MODULES or a SERVED_SCRIPTS script, the
process becomes a shim:
it sends the fork server the module, argv, cwd, environment, interpreter and its own stdin/stdout/stderr
(SCM_RIGHTS), as tests/helpers/forked.py ForkedPopen does; the server checks that it serves that
import-time environment (tests/helpers/fork_env.py) and forks the command. The shim then stands for
the command toward whoever started it (torchrun's agent polls its pid, sends it SIGTERM through its
process group and, past the timeout, SIGKILL):
- SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 it receives go to the command;
- it ends as the command ended: its exit code, or the same signal (raised on itself);
- killed itself (SIGKILL), its connection closes and the server kills the command with SIGKILL.
Anything else (no server, a refused environment, other interpreter options) returns at once and the
interpreter starts as it always does. GPUPLAN_TEST_FORK=0 in the environment turns it off.
"""

from __future__ import annotations

import os
import sys

SOCKET_VAR = "GPUPLAN_TEST_FORK_SOCKET"
# The module every rank runs (gpuplan/apply/launch/torchrun.py launch_command; tests/test_fork_server.py checks
# that they agree) and torchrun's own.
RANK_MODULE = "gpuplan.apply.launch.worker"
SERVED_MODULES = frozenset({"torch.distributed.run", RANK_MODULE, "gpuplan", "gpuplan.cli"})
# The .py files directly in this checkout's benchmarks/ folder (as tests/helpers/forked.py serves them).
SERVED_SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "benchmarks")
SERVED_OPTIONS = frozenset({"-u"})  # interpreter options the forked child reproduces (fork_server.py)
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def _target(argv: list[str]) -> tuple[dict[str, object], bool] | None:
    """({"module": MODULE, "argv": ARGS} or {"path": SCRIPT, "argv": ARGS}, unbuffered) for
    `python [-u] -m MODULE ARGS` of a served module or `python [-u] SCRIPT ARGS` of a served script, else None."""
    rest = argv[1:]
    options = []
    while rest and rest[0] in SERVED_OPTIONS:
        options.append(rest.pop(0))
    unbuffered = "-u" in options
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] in SERVED_MODULES:
        return {"module": rest[1], "argv": rest[2:]}, unbuffered
    if rest and rest[0].endswith(".py") and not rest[0].startswith("-"):
        path = os.path.realpath(rest[0])
        if os.path.dirname(path) == os.path.realpath(SERVED_SCRIPTS) and os.path.isfile(path):
            return {"path": path, "argv": rest[1:]}, unbuffered
    return None


def _shim() -> None:
    path = os.environ.get(SOCKET_VAR)
    if not path or os.environ.get("GPUPLAN_TEST_FORK", "1") == "0":
        return
    target = _target(list(getattr(sys, "orig_argv", [])))
    if target is None:
        return
    import json
    import signal
    import socket
    import struct

    command, unbuffered = target
    try:
        request = {
            **command,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "executable": sys.executable,
            "unbuffered": unbuffered,
            "check": True,
            "hangup_kills": True,
        }
        data = json.dumps(request).encode()
    except (OSError, ValueError):
        return
    pid: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not pid:
            pending.append(signum)  # the command is not running yet: it gets it once it is
            return
        try:
            os.kill(pid[0], signum)
        except OSError:
            pass

    signals = [getattr(signal, name) for name in FORWARDED]
    previous = {s: signal.signal(s, forward) for s in signals}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    buffer = b""

    def line() -> str:
        nonlocal buffer
        while b"\n" not in buffer:
            part = conn.recv(4096)
            if not part:
                return ""
            buffer += part
        text, buffer = buffer.split(b"\n", 1)
        return text.decode()

    try:
        conn.connect(path)
        socket.send_fds(conn, [struct.pack("!Q", len(data))], [0, 1, 2])
        conn.sendall(data)
        first = line()
    except OSError:
        first = ""
    if not first.startswith("pid "):  # not served: start as a fresh interpreter, as without the shim
        conn.close()
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in pending:
            signal.raise_signal(s)
        return
    pid.append(int(first.split()[1]))
    for s in pending:
        forward(s, None)
    try:
        last = line()
    except OSError:
        last = ""
    status = int(last.split()[1]) if last.startswith("status ") else 255 << 8
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


_shim()
