"""Which environments a test worker's fork server (tests/helpers/fork_server.py) can serve: the one
rule its client (forked.py) and the server itself (for the ranks torchrun starts, boot/sitecustomize.py)
both apply. Standard library only: the server imports it before anything else.

A server serves one import-time environment: the environment minus the variables the code reads only
when it runs (IMPORT_FREE) and minus THREAD_VARS, which the libraries read at import but a forked child
can still apply itself (fork_server.apply_threads), so a server is started without them.
"""

from __future__ import annotations

from collections.abc import Mapping

# Read by gpuplan or torch.distributed when the command runs, never at import: a server started under
# other values serves these correctly (tests/test_fork_server.py checks gpuplan reads its own at run time).
IMPORT_FREE_PREFIXES = ("GPUPLAN_", "PYTEST_", "TORCHELASTIC_")
IMPORT_FREE = frozenset(
    {
        "NO_COLOR",
        "COLUMNS",
        "LINES",
        "PWD",
        "OLDPWD",
        "TMPDIR",  # tempfile reads it at its first use, and the child's tempfile.tempdir is reset (fork_server.py)
        "_",
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
    }
)
# Read at import (libgomp and OpenBLAS size their pools from it when they load; torch's intra-op count
# follows), and torchrun sets it to 1 for every rank of a multi-process node (torch/distributed/run.py):
# the forked child applies it with torch.set_num_threads and threadpoolctl (fork_server.apply_threads),
# which gives the counts a fresh process has (intra-op and OpenMP/BLAS pools; the inter-op pool does not
# follow it in either).
THREAD_VARS = ("OMP_NUM_THREADS",)


def signature(env: Mapping[str, str]) -> frozenset[tuple[str, str]]:
    """What a server must share with a command to serve it."""
    return frozenset(
        (k, v) for k, v in env.items() if k not in IMPORT_FREE and k not in THREAD_VARS and not k.startswith(IMPORT_FREE_PREFIXES)
    )


def threads_applicable(env: Mapping[str, str]) -> bool:
    """A thread count the child can apply: unset, or a positive whole number (anything else is what a
    fresh process reports on, e.g. libgomp's 'Invalid value for environment variable OMP_NUM_THREADS')."""
    return all(env.get(k) is None or (env[k].isdigit() and int(env[k]) > 0) for k in THREAD_VARS)


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a server for `env` starts with: its libraries' thread pools at their defaults."""
    return {k: v for k, v in env.items() if k not in THREAD_VARS}
