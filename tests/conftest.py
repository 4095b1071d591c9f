"""Fixtures shared by the tests. Helper functions and constants live in tests.helpers
(imported as `from tests.helpers.planning import ENV`), not as top-level modules.

Every test gets its own empty calibration store and prices file: a run measured by one
test never changes another test's plan, and the user's own files are never touched."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import file_costs, write_guard
from tests.helpers.planning import ENV, SPECS

# The session's own folder: the user files gpuplan reads and writes (calibration, prices, the CPU
# probe) and the caches libraries write (matplotlib's fonts, torch.compile's kernels) point here from
# the start, so nothing the suite runs (module fixtures and the processes they start included) can
# reach the user's ~/.cache or ~/.config (XDG_CACHE_HOME and XDG_CONFIG_HOME are the session's too); each
# test then gets its own calibration and prices files.
SESSION = tempfile.mkdtemp(prefix="gpuplan-session-")
atexit.register(shutil.rmtree, SESSION, ignore_errors=True)


def _private_session_files() -> None:
    os.environ["GPUPLAN_CALIBRATION_FILE"] = os.path.join(SESSION, "calibration.jsonl")
    os.environ["GPUPLAN_PRICES_FILE"] = os.path.join(SESSION, "prices.toml")
    os.environ["MPLCONFIGDIR"] = os.path.join(SESSION, "matplotlib")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(SESSION, "torchinductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(SESSION, "triton")
    # every other library cache and config that follows the XDG base directories: the Hugging Face caches
    # (huggingface_hub constants: HF_HOME defaults to $XDG_CACHE_HOME/huggingface, and the datasets cache
    # lm-eval's local tasks build under it), torch's hub; a test that builds a Hub cache sets HF_HOME itself
    os.environ["XDG_CACHE_HOME"] = os.path.join(SESSION, "cache")
    os.environ["XDG_CONFIG_HOME"] = os.path.join(SESSION, "config")


def _fixed_cpu_probe() -> None:
    """Every CPU plan in the tests (and the CLIs they start) reads these fixed CPU figures,
    not the machine's measured ones (hardware/cpu_probe.py): its outputs stay the same."""
    from gpuplan.hardware.cpu_probe import PROBE_ENV, VERSION, _cpu_model, _omp
    from gpuplan.hardware.detect import _cpu_count

    path = os.path.join(SESSION, "cpu-probe.json")
    entry = {
        "version": VERSION,
        "cpu": _cpu_model(),
        "cpus": _cpu_count(),
        "omp_threads": _omp(),
        "fp32_tflops": 0.1,
        "gbyte_per_s": 10.0,
        "threads": 2,
        "measured_at": "fixed by tests/conftest.py",
    }
    with open(path, "w") as f:
        json.dump({"machines": [entry]}, f)
    os.environ[PROBE_ENV] = path


def _threads_per_worker() -> None:
    """Under xdist, each worker's share of the cores as its thread count (OMP_NUM_THREADS, which torch,
    libgomp and OpenBLAS read when they load, and the commands the tests start inherit), unless the run
    sets one. Two workers of two threads each on 2 cores spin-wait in OpenMP's barriers for each other's
    cores: tests/apply/test_apply_lora.py run twice side by side took 156 s each that way, 50 s at one
    thread each (alone, at two threads: 50 s)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(workers)))


_threads_per_worker()  # before anything imports torch
_private_session_files()
_fixed_cpu_probe()


def pytest_addoption(parser):
    parser.addoption(
        "--record-file-costs",
        metavar="PATH",
        help="add up each test file's durations and merge them into PATH (tests/file_costs.json; tests/helpers/file_costs.py)",
    )


def pytest_configure(config):
    path = config.getoption("--record-file-costs")
    if path:
        config.pluginmanager.register(file_costs.Recorder(Path(path)), "gpuplan-file-costs")
    # pytest-xdist's --dist loadfile queues the files by their number of tests unless told not to
    # (xdist/scheduler/loadscope.py, --loadscope-reorder on by default): the longest-first order below
    # would be undone, and the one-test files that run longest (the Slurm and Ray clusters) left for the end
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """Longest test files first (tests/file_costs.json), each file's tests together and in their
    order: `--dist loadfile` hands out files in this order, so no long file is left for the end."""
    file_costs.order(items, file_costs.load())


CANNOT_FIT = frozenset({"mistral-7b-24gb.toml"})  # shipped to show the no-fit error


@pytest.fixture(scope="session")
def shipped_plans():
    """name -> Plan for every shipped spec that fits, planned once with the fixed test environment."""
    from gpuplan.plan.build import plan_file

    return {p.name: plan_file(p, environment=ENV) for p in sorted(SPECS.glob("*.toml")) if p.name not in CANNOT_FIT}


def _restore_environment(before: dict[str, str]) -> None:
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


# os.environ as it was before each test and each test file: what a test or a module fixture sets there
# (lm_eval's import sets HF_XET_HIGH_PERFORMANCE, an in-process apply sets TQDM_DISABLE) would follow
# every later test and, being read at import, give each later CLI run a fork server of its own
# (tests/helpers/forked.py). Autouse fixtures of a scope run before the test file's own of that scope.
@pytest.fixture(scope="module", autouse=True)
def _environment_restored_per_file():
    before = dict(os.environ)
    yield
    _restore_environment(before)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A fixture shared by several tests (module, class or session scope) leaves os.environ as it found
    it once it is set up: an in-process apply in one (apply/quiet.py sets TQDM_DISABLE and
    HF_DATASETS_DISABLE_PROGRESS_BARS, both read at import) would otherwise give the file's later CLI runs
    a fork server of their own. Those that set variables for their tests do so in a MonkeyPatch context
    they undo themselves."""
    if fixturedef.scope == "function":
        return (yield)
    before = dict(os.environ)
    try:
        return (yield)
    finally:
        _restore_environment(before)


@pytest.fixture(autouse=True)
def _environment_restored():
    before = dict(os.environ)
    yield
    _restore_environment(before)


@pytest.fixture(autouse=True)
def _private_user_files(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("userfiles")
    monkeypatch.setenv("GPUPLAN_CALIBRATION_FILE", str(d / "calibration.jsonl"))
    monkeypatch.setenv("GPUPLAN_PRICES_FILE", str(d / "prices.toml"))


@pytest.fixture(scope="module", autouse=True)
def _writes_only_its_own_temp_dirs(request):
    """Fail a test file that wrote into the checkout, the user's gpuplan files or gpuplan's names in
    the system temp dir (tests/helpers/write_guard.py); under xdist the other worker's file may be
    the writer, so the message names the paths."""
    before = write_guard.snapshot()
    yield
    paths = write_guard.persisting(write_guard.written(before, write_guard.snapshot()))
    if paths:
        pytest.fail(
            f"{request.node.nodeid} (or the test file another worker ran meanwhile) wrote outside its temporary "
            f"directories: {', '.join(paths[:8])}{' ...' if len(paths) > 8 else ''}; write under tmp_path instead",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    """The tiny Idefics3 and its processor, built once and saved (tests/helpers/vlm_base.py): the VLM tests' base."""
    from tests.helpers.vlm_base import build_base

    return build_base(tmp_path_factory.mktemp("tiny-vlm") / "base")
