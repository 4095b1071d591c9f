"""A fork server for the tests: one long-lived process per test worker that has imported torch,
transformers, peft, bitsandbytes, TRL and gpuplan once, and forks a fresh child for each `gpuplan`
command a test runs (tests/helpers/cli_runs.py is its client).

Why: each `python -m gpuplan.cli apply ...` spends about 9 s importing those libraries before it does
anything (`python -X importtime`), and the suite starts about a hundred of them. A forked child starts
in milliseconds with the same modules already loaded.

What a test proves is unchanged, because the child is a real, separate process that runs the real
CLI as `python -m gpuplan.cli ARGV` would:
- it gets the test's argv, working directory, environment (os.environ replaced, so the processes it
  starts, e.g. torchrun's ranks, inherit it) and the test's own stdin/stdout/stderr file descriptors
  (passed over a Unix socket with SCM_RIGHTS), with sys.stdin/stdout/stderr rebuilt on them as
  Python's start-up builds them;
- it runs `gpuplan.cli` as `__main__` (runpy, as `-m` does), with sys.path[0] the working directory
  (or a benchmarks/ script as `python SCRIPT` would: runpy.run_path, sys.path[0] the script's folder)
  and then its own PYTHONPATH's entries before the venv's (child_path),
  default signal handlers (SIGINT raises KeyboardInterrupt), a fresh tempfile directory and a fresh
  random state, and ends as the interpreter ends (thread joins, atexit handlers, garbage collected, stdio flushed:
  `_finalize` says what it leaves out and why);
- the test holds the child's own pid: SIGINT, SIGTERM and SIGKILL reach the command itself, and its
  exit status (a signal included) comes back exactly as waitpid reported it.
The client sends only commands whose import-time environment equals this server's (the libraries
read some variables once, at import: huggingface_hub's cache paths, datasets' offline switch, tqdm's
defaults); any other goes to a plain subprocess, as before. Importing the libraries here prints no
warning and no log record at INFO or above (checked by tests/test_fork_server.py), so a child's
notices are what a fresh process's would be.

Protocol, one connection per command: the client sends an 8-byte length with three file descriptors
(stdin, stdout, stderr) attached, then that many bytes of JSON {module or path, argv, cwd, env}; the server
answers `pid N\\n` once the child runs and `status S\\n` (the raw waitpid status) when it ends.
A request may also carry (the boot shim's do, boot/sitecustomize.py, for torchrun's agent and ranks):
- "check": true: the server itself checks the request's environment and interpreter against its own
  (fork_env.py) and answers `refused WHY\\n` for one it cannot serve (the shim then runs as a fresh
  interpreter);
- "hangup_kills": true: the client going away before the child ends (the shim killed by SIGKILL) kills
  the child with SIGKILL, as the process the client stands for would have been;
- "unbuffered": true: stdout and stderr unbuffered, as `python -u` makes them (torchrun starts ranks so);
  a command whose environment sets PYTHONUNBUFFERED gets the same (fork_env.STDIO_VARS).
Each command served is logged as a line of JSON {module, client (the client's pid), pid} in
`served.jsonl` beside the socket (how tests/test_fork_server.py sees that a rank was forked).
Run: python tests/helpers/fork_server.py SOCKET_PATH   (prints `ready` on stdout when it serves).
"""

from __future__ import annotations

import importlib
import io
import json
import os
import pkgutil
import select
import signal
import socket
import struct
import sys
import tempfile

try:
    from tests.helpers import fork_env
except ImportError:  # the repository is not on sys.path: this script's folder is sys.path[0]
    import fork_env  # type: ignore[no-redef]

# The import-time environment this server serves, as it was given (before the libraries' imports,
# which may set variables of their own) and the interpreter it runs.
OWN_SIGNATURE = fork_env.signature(os.environ)
OWN_THREADS = {k: os.environ.get(k) for k in fork_env.THREAD_VARS}
# sys.path past its first entry and the server's own PYTHONPATH: the site-packages and the rest that a
# fresh interpreter of this venv has whatever its PYTHONPATH (child_path adds the command's own).
_OWN_PYTHONPATH = fork_env.python_path(os.environ, os.getcwd())
BASE_PATH = [p for p in sys.path[1:] if p not in _OWN_PYTHONPATH]

# What gpuplan's commands import (apply, the after-run commands, plan --trace): loaded once here.
PRELOAD = (
    "torch",
    "numpy",
    "safetensors.torch",
    "transformers",
    "transformers.trainer",
    "transformers.models.llama.modeling_llama",
    "transformers.models.bert.modeling_bert",
    "transformers.models.gpt2.modeling_gpt2",
    "accelerate",
    "datasets",
    "peft",
    "bitsandbytes",
    "trl",
    "trl.trainer.dpo_trainer",
    "trl.trainer.kto_trainer",
    # torch._dynamo's atexit handler (utils.dump_compile_times) imports it in every command's exit: 0.05 s each
    "tabulate",
)


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # an optional library that is not installed: the child imports (or misses) it itself
            pass
    import gpuplan

    for info in pkgutil.walk_packages(gpuplan.__path__, "gpuplan."):
        if info.name.endswith("__main__"):
            continue  # running it would run the CLI
        try:
            importlib.import_module(info.name)
        except Exception:  # a module needing an absent optional library
            pass


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise ConnectionError("client went away")
        data += part
    return data


def serve(path: str) -> tuple[socket.socket, list[int], dict] | None:
    """Accept commands until the parent (the test worker) goes away. Returns only in a command's
    child, with what it needs to run; the server and each child's watcher never return."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the watchers reap themselves
    import gpuplan

    print("ready", os.path.dirname(os.path.abspath(gpuplan.__file__)), flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:
                os._exit(0)
            continue
        conn.settimeout(None)
        fds = []
        try:
            head, fds, _, _ = socket.recv_fds(conn, 8, 3)
            (size,) = struct.unpack("!Q", head)
            request = json.loads(_read_exact(conn, size))
            refusal = _refusal(request) if request.get("check") else None
            if refusal is not None:
                conn.sendall(f"refused {refusal}\n".encode())
                _log_refusal(request, refusal)
        except (OSError, ValueError, struct.error, AttributeError, TypeError):
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        if refusal is not None or len(fds) != 3:
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:  # the watcher: forks the command, reports its pid and its end
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            child = os.fork()
            if child == 0:
                return conn, fds, request
            for fd in fds:
                os.close(fd)
            _log(path, conn, request, child)
            try:
                conn.sendall(f"pid {child}\n".encode())
            except OSError:
                pass
            status = _wait(child, conn, kill_on_hangup=bool(request.get("hangup_kills")))
            try:
                conn.sendall(f"status {status}\n".encode())
            except OSError:
                pass
            os._exit(0)
        conn.close()
        for fd in fds:
            os.close(fd)


def _refusal(request: dict) -> str | None:
    """Why this server cannot serve a checked request as a fresh interpreter would run it; None if it can."""
    env = request.get("env")
    if not isinstance(env, dict):
        return "no environment"
    if request.get("executable") != sys.executable:
        return f"another interpreter ({request.get('executable')})"
    if fork_env.signature(env) != OWN_SIGNATURE:
        keys = sorted({k for k, _ in fork_env.signature(env) ^ OWN_SIGNATURE})
        return "an import-time environment of its own: " + ",".join(keys)
    if not fork_env.threads_applicable(env) or any(v is not None and env.get(k) != v for k, v in OWN_THREADS.items()):
        return "a thread count the child cannot apply: " + ",".join(fork_env.THREAD_VARS)
    return None


def _log_refusal(request: dict, why: str) -> None:
    """With GPUPLAN_TEST_FORK_LOG set (tests/helpers/forked.py LOG_VAR), a line saying what was refused and why:
    each refusal is a fresh interpreter's imports (about 9 s) the run paid."""
    log = os.environ.get("GPUPLAN_TEST_FORK_LOG")
    if log:
        try:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps({"refused": request.get("module") or request.get("path"), "why": why}) + "\n")
        except OSError:
            pass


def _log(path: str, conn: socket.socket, request: dict, child: int) -> None:
    """One line of served.jsonl beside the socket: what ran, for which client, as which pid."""
    try:
        client, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        line = json.dumps({"module": request.get("module") or request.get("path"), "client": client, "pid": child})
        with open(os.path.join(os.path.dirname(path), "served.jsonl"), "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _wait(child: int, conn: socket.socket, kill_on_hangup: bool) -> int:
    """The child's raw waitpid status; with kill_on_hangup, the client hanging up first kills it (SIGKILL)."""
    if kill_on_hangup:
        pidfd = os.pidfd_open(child)
        try:
            while True:
                ready, _, _ = select.select([conn, pidfd], [], [])
                if pidfd in ready:
                    break
                try:
                    hung_up = not conn.recv(64)
                except OSError:
                    hung_up = True
                if hung_up:
                    os.kill(child, signal.SIGKILL)
                    break
        finally:
            os.close(pidfd)
    while True:
        try:
            return os.waitpid(child, 0)[1]
        except InterruptedError:
            continue


def apply_threads(env: dict) -> None:
    """What a fresh process gets from OMP_NUM_THREADS at import, in a child whose libraries were loaded
    without it (fork_env.THREAD_VARS): torch's intra-op threads, and the OpenMP and BLAS pools."""
    value = env.get("OMP_NUM_THREADS")
    if value is None:
        return
    n = int(value)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    import threadpoolctl

    threadpoolctl.threadpool_limits(limits=n)
    # threadpoolctl's import sets KMP_DUPLICATE_LIB_OK in os.environ (threadpoolctl.py, setdefault at import),
    # which a fresh process's command never does: the processes it starts (torchrun's ranks) would carry an
    # import-time environment of their own and be refused by this server
    os.environ.clear()
    os.environ.update(env)


def _std_streams(unbuffered: bool = False) -> None:
    """sys.stdin/stdout/stderr on fds 0-2 as Python's start-up makes them (stderr line-buffered and
    backslashreplace; stdout line-buffered only on a terminal; with `-u`, both straight on the file
    descriptor and written through, create_stdio in CPython's Python/pylifecycle.c)."""
    enc = sys.stdout.encoding
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=enc)
    if unbuffered:
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding=enc, line_buffering=os.isatty(1), write_through=True
        )
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding=enc, errors="backslashreplace", line_buffering=True, write_through=True
        )
        return
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding=enc, line_buffering=os.isatty(1)
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding=enc, errors="backslashreplace", line_buffering=True
    )


def child_path(first: str, env: dict, cwd: str) -> list[str]:
    """sys.path as `python` starts it under env: its first entry, the PYTHONPATH entries, then the rest."""
    path = [first]
    for p in [*fork_env.python_path(env, cwd), *BASE_PATH]:
        if p not in path:
            path.append(p)
    return path


def run_child(conn: socket.socket, fds: list[int], request: dict) -> None:
    """In the forked child: become `python -m MODULE ARGV` in the test's cwd, env and stdio."""
    conn.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = child_path(os.getcwd(), request["env"], os.getcwd())
    tempfile.tempdir = None
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh process seeds numpy's global state from the OS
    apply_threads(request["env"])
    _std_streams(unbuffered=bool(request.get("unbuffered")) or fork_env.unbuffered(request["env"]))
    import runpy

    try:
        if request.get("path"):  # `python SCRIPT ARGV`: the script's directory first on sys.path
            sys.argv = [request["path"], *request["argv"]]
            sys.path[0] = os.path.dirname(request["path"])
            runpy.run_path(request["path"], run_name="__main__")
        else:
            sys.argv = ["-m", *request["argv"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finalize(code)


def _exit_code(code: object) -> int:
    """SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finalize(code: int) -> None:
    """The interpreter's exit, less its module teardown: wait for non-daemon threads, run the atexit
    handlers, collect the command's garbage (its objects' finalizers run, e.g. files are flushed),
    flush stdio, exit. Tearing down the inherited modules would only write to every page of the
    shared heap (copy-on-write: 15-20 s of a loaded machine for a 0.1 s command) and has no effect a
    test can see; the server's own objects were frozen out of the collector (gc.freeze) before the fork."""
    import atexit
    import gc
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # an uncaught KeyboardInterrupt: the interpreter ends by SIGINT (bpo-1054041)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


if __name__ == "__main__":
    preload()
    import gc

    gc.collect()
    gc.freeze()  # the children's collections skip what the server loaded (no copy-on-write of it)
    # The finalizers of the server's own objects are not the command's: a child's exit skips them as it skips
    # the modules' teardown (_finalize). torch.library's (a Library per op namespace the preloaded libraries
    # register: torch/library.py _del_library) deregister their ops, 0.1 s of every command's exit
    import weakref

    for f in list(weakref.finalize._registry):  # type: ignore[attr-defined]
        f.atexit = False
    child = serve(sys.argv[1])
    if child is not None:
        run_child(*child)
