"""Every script in benchmarks/ runs in its quick mode: exit 0, its result printed, no file of the checkout written.

A script is a benchmarks/*.py file with a `__main__` block, found by glob: a new script is
covered without touching this file (it then fails until RESULT names the line its quick run
prints). Each runs as users run it (`python benchmarks/<script> --quick`) in a process of its own,
forked from the worker's pre-imported fork server (tests/helpers/fork_server.py: the script runs as
`__main__` with its argv, cwd, environment and stdio; a plain subprocess when no server can serve it;
the `python -m gpuplan ...` and benchmark scripts it starts in turn are forked by the same server through
tests/helpers/boot/sitecustomize.py),
with TMPDIR set to the test's own directory so the temporary files it makes are the test's.
The others (results.py, published_rows.py) are modules the scripts import.

The quick modes are tiny versions of the same measurement (see each script's docstring);
the full modes are what benchmarks/RESULTS.md quotes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli_runs import BOOT, run

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if '__name__ == "__main__"' in p.read_text(encoding="utf-8"))
MODULES = sorted(p for p in BENCH.glob("*.py") if p not in SCRIPTS)

# The line each quick run prints when it has measured something (a regex, searched in stdout).
RESULT = {
    "apply_overhead": r"throughput ratio gpuplan/hand \d+\.\d+ \(target >= 0\.97\); time-to-first-step ratio \d+\.\d+",
    "attention_support": r"attention_support\.json is up to date: 3 families checked",
    "fit_step_time": r"fitted on \d+ rows \(\d+ iterations, objective \d",
    "fsdp_adapters": r"median \|error\| \d+\.\d% over \d+ rows",
    "fuzz": r"\*\*\d+ examples in \d+ s\*\*; pytest: `\d+ passed",
    "gpu_check": r"\| llama \| full \| bf16 .*\n(.|\n)*1 cases in \d+ s",
    "host_overhead": (
        r"host seconds per kernel \(median of 2\): \d+\.\d us; Trainer per step: -?\d+\.\d ms\ncheckpointing's host work per layer"
    ),
    "kernel_counts": r'counted: \{"layer": \[\d+\.\d, \d+\.\d\](.|\n)*the model\'s constants: \{"layer": \[44,',
    "lora_coefficients": r"llama fp32 lora fit: \{'c_h': -?\d",
    "lora_memory_accuracy": r"2 cases: analytic \|error\| median \d+\.\d+%, max \d+\.\d+%",
    "memory_accuracy": r"3 cases: analytic \|error\| median \d+\.\d+%, max \d+\.\d+%; accelerate median",
    "memory_coefficients": r"fit: +\{'c_h': -?\d(.|\n)*table: \(",
    "memory_guard": r"qlora +1 cases: median \|error\| \d+\.\d+%(.|\n)*3 cases in \d+ s",
    "moe_activations": r"analytic vs traced peak: max \|error\| \d+\.\d+%",
    "plan_apply_fuzz": r"\*\*2 cases in \d+ s\*\*(.|\n)*\| refused \| \d+ \|\n\| applied \| \d+ \|\n\| failed \| \d+ \|",
    "plan_speed": r"\| `gpuplan plan specs/tiny\.toml` \| \d+\.\d{3} \|",
    "preference_memory_accuracy": r"1 cases: median \|error\| \d+\.\d+%, max \d+\.\d+%",
    "published_lora": r"published +\d+\.\d+ GiB +plan +\d+\.\d+ GiB",
    "readme_examples": r".+ regenerated in memory \((no change|would change: .+)\)",
    "saver_memory": r"\| full \| 2,048 \| none \| \d+\.\d+ \|",
    "adapter_traffic": r"adapter bytes, traced vs modelled: largest difference \d+\.\d\d B per element",
    "layer_traffic": r"layer bytes, traced / hand count \(Llama-2-7B, bf16\): \d+\.\d\dx",
    "throughput_accuracy": r"Targets: median <= 20% overall \(\d+\.\d%\)",
    "time_accuracy": r"\| S \| \d+\.\d+M \| \d+\.\dM \| \d+\.\d+ \(",
    # a signed figure: the quick run's 6 micro-batches can measure a negative difference under load (the full run
    # refuses to write one: zero_overhead.py)
    "zero_overhead": r"ZeRO host seconds per tensor \(median\): stage 2 -?\d+\.\d us; stage 3 -?\d+\.\d us",
}
# Quick runs that import torch and train or trace (about 10 s to a minute each on 2 shared cores).
SLOW = {
    "adapter_traffic",
    "apply_overhead",
    "attention_support",
    "fuzz",
    "gpu_check",
    "host_overhead",
    "kernel_counts",
    "layer_traffic",
    "lora_coefficients",
    "lora_memory_accuracy",
    "memory_accuracy",
    "memory_coefficients",
    "memory_guard",
    "moe_activations",
    "plan_apply_fuzz",
    "plan_speed",
    "preference_memory_accuracy",
    "time_accuracy",
    "zero_overhead",
}
# DeepSpeed lives beside the test environment, not in it (the planner reads whether it is installed): .ci/run
# installs it into a folder of its own and names it here; zero_overhead.py's quick run takes it on its PYTHONPATH.
DEEPSPEED_PATH = os.environ.get("GPUPLAN_TEST_DEEPSPEED_PATH", "")
NEEDS_DEEPSPEED = {"zero_overhead"}


def _checkout_files() -> dict[str, str]:
    """What a benchmark could write in the checkout: sha256 of each file under benchmarks/, README.md and the
    generated tables, and `git status` (tracked files changed, untracked files added). Ignored paths are
    left out: other tests running beside this one write there (runs/, .hypothesis/, __pycache__)."""
    paths = [p for p in BENCH.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    paths += [REPO / "README.md", REPO / "gpuplan" / "modelinfo" / "attention_support.json"]
    out = {str(p.relative_to(REPO)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.exists()}
    git = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True, text=True)
    if git.returncode == 0:  # a git checkout (not an unpacked sdist)
        out["git status"] = git.stdout
    return out


@pytest.mark.parametrize("script", [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else []) for p in SCRIPTS])
def test_quick_mode_runs_and_prints_its_result(script: Path, tmp_path: Path):
    assert script.stem in RESULT, f"benchmarks/{script.name}: add the line its --quick run prints to RESULT in {Path(__file__).name}"
    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),
        # the boot shim serves the gpuplan commands and scripts a benchmark starts from the same fork server
        "PYTHONPATH": f"{REPO}{os.pathsep}{BOOT}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        # PYTHONDONTWRITEBYTECODE as the worker has it: a value of its own would be an import-time environment of
        # its own, which the worker's fork server does not serve (the first script and its children then ran as
        # fresh interpreters: apply_overhead 54 s instead of about 10); the byte-code caches it may write are
        # ignored paths (.gitignore __pycache__/), which _checkout_files leaves out
    }
    if script.stem in NEEDS_DEEPSPEED:
        if not DEEPSPEED_PATH and importlib.util.find_spec("deepspeed") is None:
            pytest.skip("DeepSpeed is not installed beside this environment (.ci/run installs it; GPUPLAN_TEST_DEEPSPEED_PATH)")
        if DEEPSPEED_PATH:
            env["PYTHONPATH"] += os.pathsep + DEEPSPEED_PATH
        env["MLFLOW_DISABLE_TELEMETRY"] = "true"  # `import deepspeed` imports mlflow, whose telemetry writes ~/.config
    before = _checkout_files()
    r = run([sys.executable, str(script), "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}"
    assert re.search(RESULT[script.stem], r.stdout), f"no result line /{RESULT[script.stem]}/ in:\n{r.stdout[-3000:]}"
    assert _checkout_files() == before, "a --quick run wrote into the checkout"


def test_every_module_that_is_not_a_script_is_imported_by_one():
    """results.py and published_rows.py run only through the scripts: each is imported by one."""
    texts = [p.read_text(encoding="utf-8") for p in SCRIPTS]
    for m in MODULES:
        pattern = rf"^\s*(from {m.stem} import|import {m.stem}\b)"
        assert any(re.search(pattern, t, re.M) for t in texts), f"benchmarks/{m.name} has no __main__ and no script imports it"
    assert {m.stem for m in MODULES} >= {"results"} and len(SCRIPTS) >= 19


def test_zero_overhead_without_deepspeed_says_how_to_install_it_beside_the_environment(tmp_path: Path):
    """Run where DeepSpeed cannot be imported, the ZeRO benchmark exits 1 and names the install that keeps it out of
    the environment gpuplan plans in (and writes nothing)."""
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is importable in this environment")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    before = _checkout_files()
    r = subprocess.run(
        [sys.executable, str(BENCH / "zero_overhead.py"), "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "deepspeed is not importable here: pip install --target DIR --no-deps deepspeed" in r.stderr
    assert "then run with PYTHONPATH=DIR" in r.stderr
    assert _checkout_files() == before


def test_the_device_scripts_parse_and_carry_what_the_gpu_image_lacks():
    """benchmarks/device/: fetch_wheels.sh downloads, run_checks.sh installs offline on the lent GPU machine, whose image
    has CUDA torch, transformers, peft and accelerate but none of these (the device tool's package list)."""
    for name in ("fetch_wheels.sh", "run_checks.sh"):
        assert subprocess.run(["bash", "-n", str(BENCH / "device" / name)], capture_output=True).returncode == 0, name
    fetch = (BENCH / "device" / "fetch_wheels.sh").read_text()
    listed = re.search(r"for name in ([^;]+);", fetch).group(1).split()
    assert {"pydantic", "pydantic_core", "tomlkit", "bitsandbytes", "datasets"} <= set(listed)
    run_checks = (BENCH / "device" / "run_checks.sh").read_text()
    for script in ("host_overhead.py", "kernel_counts.py", "gpu_check.py"):
        assert f"{script} --device cuda" in run_checks, script


def _host_overhead():
    """benchmarks/host_overhead.py as a module (it imports its sibling results.py, so benchmarks/ goes on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import host_overhead

    return host_overhead


def test_checkpointings_host_work_is_derived_in_one_unit_and_a_negative_adapter_figure_is_reported():
    """host_overhead.checkpoint_host_kernels: each checkpointed row's excess over its method's row without checkpointing,
    less its added launches at that method's own rate, in launches' worth at the one prior rate."""
    host_overhead = _host_overhead()

    def row(method, ckpt, ms, kernels):
        return {"method": method, "checkpointing": ckpt, "host_ms_per_layer": ms, "kernels_per_layer": kernels}

    rows = [
        row("full", "none", 1.0, 100),  # 10 us a launch
        row("full", "reentrant", 2.0, 140),  # 1000 us more, 40 launches of it: 600 us of its own = 60 launches at 10 us
        row("full", "non-reentrant", 2.4, 140),  # 1000 us of its own
        row("lora", "none", 4.0, 200),  # 20 us a launch: the recomputed launches are priced at this rate
        row("lora", "reentrant", 5.0, 240),  # 1000 - 40 x 20 = 200 us: 400 us below full's over 7 adapters
        row("lora", "non-reentrant", 6.5, 240),  # 2500 - 800 = 1700 us: 700 us over full's = 70 launches, 10 an adapter
    ]
    out, raw = host_overhead.checkpoint_host_kernels(rows, 10.0)
    assert out == {"reentrant": [60.0, 0.0], "non-reentrant": [100.0, 10.0]}
    assert raw == {"reentrant": round(-400 / 10 / 7, 1), "non-reentrant": 10.0}


def test_a_host_cost_measured_at_or_below_zero_as_written_is_refused():
    """host_overhead.py and zero_overhead.py write no cost that rounds to zero or below (a plan would take it as one)."""
    host_overhead = _host_overhead()
    assert host_overhead.unresolved({"kernel_s": 5.85e-06, "trainer_step_s": 0.00321}) == []
    # round(x * 1e-6, 7) of 0.04 us writes 0.0; a difference of timings can come out negative under load
    assert host_overhead.unresolved({"zero2_hook_s": round(0.04e-6, 7), "zero3_hook_s": -1.6e-4, "ok": 3e-4}) == [
        "zero2_hook_s",
        "zero3_hook_s",
    ]
