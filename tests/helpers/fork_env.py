"""Which environments a test worker's fork server (tests/helpers/fork_server.py) can serve: the one
rule its client (forked.py) and the server itself (for the ranks torchrun starts, boot/sitecustomize.py)
both apply. Standard library only: the server imports it before anything else.

A server serves one import-time environment: the environment minus the variables the code reads only
when it runs (IMPORT_FREE) and minus THREAD_VARS, which the libraries read at import but a forked child
can still apply itself (fork_server.apply_threads), so a server is started without them.

PYTHONPATH counts without the entries that change no module a server has loaded (SERVED_PATHS): the boot
shim's folder, and this checkout where gpuplan is installed editable from it (a fresh process without it on
its path imports the same gpuplan files). The forked child rebuilds sys.path from its own PYTHONPATH as a
fresh interpreter would (fork_server.child_path), so a server started without them serves commands with them
and the other way round; any other entry (a folder of stand-in modules, say) keeps its own server. One
difference is left: the server has imported tests.helpers from the checkout, so a served command whose path
lacks the checkout could still import it where a fresh one could not (no gpuplan command imports tests).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from importlib import metadata

# Read by gpuplan or torch.distributed when the command runs, never at import: a server started under
# other values serves these correctly (tests/test_fork_server.py checks gpuplan reads its own at run time).
# RAY_*: Ray's own settings and what a Ray worker process is given (RAY_RAYLET_PID, RAY_JOB_ID, ...; ray/_private/
# services.py): read by Ray in its own processes, and by none of the libraries a gpuplan command imports (grep of
# torch, transformers, accelerate, peft, trl, datasets, huggingface_hub, bitsandbytes: the one hit, transformers'
# integrations, reads RAY_SCOPE inside a Ray Tune search, not at import)
IMPORT_FREE_PREFIXES = ("GPUPLAN_", "PYTEST_", "TORCHELASTIC_", "RAY_")
IMPORT_FREE = frozenset(
    {
        "NO_COLOR",
        "COLUMNS",
        "LINES",
        "PWD",
        "OLDPWD",
        "TMPDIR",  # tempfile reads it at its first use, and the child's tempfile.tempdir is reset (fork_server.py)
        "_",
        # a shell's prompts, read by interactive shells alone: a venv's bin/activate exports PS1 ("(.venv) "), and
        # a Ray worker started by `ray start`'s raylet has another value than the test that started the head
        "PS1",
        "PS2",
        # what torchrun's agent gives each rank (torch/distributed/elastic/agent/server/local_elastic_agent.py,
        # _start_workers; TORCHELASTIC_* by prefix): read by torch.distributed, the Trainer and accelerate
        # when they set up the process group, not at import
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        # what a Ray worker process adds besides its RAY_* variables (measured in a Ray Train worker, ray 2.60):
        # PYTHONBREAKPOINT is read when breakpoint() is called, SPT_NOENV by setproctitle, which gpuplan's
        # libraries do not import
        "SPT_NOENV",
        "PYTHONBREAKPOINT",
    }
)
# Read by the interpreter at start-up for its stdio only (Python/initconfig.c: PYTHONUNBUFFERED is `-u`): the
# forked child builds its sys.stdout/stderr unbuffered when it is set (fork_server._std_streams), as `-u` does.
STDIO_VARS = ("PYTHONUNBUFFERED",)


def unbuffered(env: Mapping[str, str]) -> bool:
    """Whether `python` started under env has unbuffered stdio (a non-empty PYTHONUNBUFFERED, as for any PYTHON* flag)."""
    return bool(env.get("PYTHONUNBUFFERED"))


# Read at import (libgomp and OpenBLAS size their pools from it when they load; torch's intra-op count
# follows), and torchrun sets it to 1 for every rank of a multi-process node (torch/distributed/run.py):
# the forked child applies it with torch.set_num_threads and threadpoolctl (fork_server.apply_threads),
# which gives the counts a fresh process has (intra-op and OpenMP/BLAS pools; the inter-op pool does not
# follow it in either).
THREAD_VARS = ("OMP_NUM_THREADS",)


# This checkout (tests/helpers/fork_env.py -> the repository root) and the boot shim's folder.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOT = os.path.join(REPO, "tests", "helpers", "boot")


def _installed_from_checkout() -> bool:
    """gpuplan installed editable from this checkout (`pip install -e .`, PEP 610's direct_url.json in its
    dist-info). Every distribution named gpuplan is read: with the checkout on sys.path, the first one found
    is the checkout's own gpuplan.egg-info, which has no direct_url.json."""
    for dist in metadata.distributions(name="gpuplan"):
        try:
            url = json.loads(dist.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        where = str(url.get("url", ""))
        if url.get("dir_info", {}).get("editable") and where.startswith("file://"):
            if os.path.realpath(where[len("file://") :]) == os.path.realpath(REPO):
                return True
    return False


# The boot shim's folder holds only sitecustomize.py, which returns at once in a served child; this checkout
# holds gpuplan, the same files a process imports from the editable install.
SERVED_PATHS = frozenset({BOOT, REPO} if _installed_from_checkout() else {BOOT})


def python_path(env: Mapping[str, str], cwd: str | None = None) -> list[str]:
    """PYTHONPATH's entries as a fresh interpreter puts them on sys.path: absolute (relative to cwd), first kept."""
    out: list[str] = []
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry:
            path = os.path.normpath(os.path.join(cwd, entry)) if cwd else entry
            if path not in out:
                out.append(path)
    return out


def signature(env: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """What a server must share with a command to serve it."""
    sig = {
        (k, v)
        for k, v in env.items()
        if k not in IMPORT_FREE
        and k not in THREAD_VARS
        and k not in STDIO_VARS
        and k != "PYTHONPATH"
        and not k.startswith(IMPORT_FREE_PREFIXES)
    }
    # relative entries stay as written (they depend on the command's cwd): such a command gets a server of its own
    kept = [e for e in python_path(env) if not (os.path.isabs(e) and os.path.normpath(e) in SERVED_PATHS)]
    if kept:
        sig.add(("PYTHONPATH", os.pathsep.join(kept)))
    return frozenset(sig)


def threads_applicable(env: Mapping[str, str]) -> bool:
    """A thread count the child can apply: unset, or a positive whole number (anything else is what a
    fresh process reports on, e.g. libgomp's 'Invalid value for environment variable OMP_NUM_THREADS')."""
    return all(env.get(k) is None or (env[k].isdigit() and int(env[k]) > 0) for k in THREAD_VARS)


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a server for `env` starts with: its libraries' thread pools at their defaults."""
    return {k: v for k, v in env.items() if k not in THREAD_VARS}
