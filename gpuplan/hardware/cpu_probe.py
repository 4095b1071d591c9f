"""This CPU's matmul rate and memory bandwidth, measured once and cached (not nominal figures).

The step-time model prices CPU training by the same terms as a GPU's (plan/estimate/step_time):
matmuls at a fraction of a peak, memory-bound work over a bandwidth. A CPU's datasheet
peak says little about what PyTorch reaches on it (AVX2 vs AVX-512, frequency, the
cores a container gets), so the peak is MEASURED: a 512 x 512 fp32 torch.mm
repeated for ~0.2 s (2 x 512^3 FLOPs each) on the threads torch uses, and the bandwidth a
64 MiB tensor copy reaches (read + write). About half a second, once per machine: the
result is cached beside the calibration store (hardware/userfiles.py), keyed by the CPU model,
the CPUs this process may use and OMP_NUM_THREADS (torch's thread count). torch is imported inside
`measure` only (the plan path stays torch-free until a CPU plan needs the figures).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PROBE_ENV = "GPUPLAN_CPU_PROBE_FILE"
MATMUL_N = 512
COPY_BYTES = 64 * 1024**2
VERSION = 1


def probe_path() -> Path:
    from gpuplan.hardware.userfiles import calibration_path

    return Path(os.environ.get(PROBE_ENV) or calibration_path().parent / "cpu-probe.json")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _omp() -> str:
    """torch's thread count follows OMP_NUM_THREADS when set: part of the key."""
    return os.environ.get("OMP_NUM_THREADS") or "default"


def machine_key(cpus: int, threads: int) -> str:
    return f"{_cpu_model()} | {cpus} CPUs | {threads} threads"


def measure(seconds: float = 0.2) -> dict[str, Any]:
    """{"fp32_tflops", "gbyte_per_s", "threads"} measured with torch on this CPU."""
    import torch

    a = torch.randn(MATMUL_N, MATMUL_N)
    b = torch.randn(MATMUL_N, MATMUL_N)
    torch.mm(a, b)  # warm-up (allocations, thread pool)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        n += 1
    flops = 2 * MATMUL_N**3 * n / (time.perf_counter() - start)
    src = torch.empty(COPY_BYTES // 4)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        dst.copy_(src)
        n += 1
    bandwidth = 2 * COPY_BYTES * n / (time.perf_counter() - start)
    return {"fp32_tflops": flops / 1e12, "gbyte_per_s": bandwidth / 1e9, "threads": torch.get_num_threads()}


def cpu_figures(cpus: int) -> dict[str, Any] | None:
    """The cached figures for this machine, measuring them on a miss; None without torch."""
    path = probe_path()
    cached: dict[str, Any] = {}
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    for entry in cached.get("machines", []) if isinstance(cached, dict) else []:
        if (
            entry.get("cpus") == cpus
            and entry.get("version") == VERSION
            and entry.get("cpu") == _cpu_model()
            and entry.get("omp_threads") == _omp()
        ):
            return entry
    try:
        figures = measure()
    except ImportError:
        return None
    entry = {
        "version": VERSION,
        "cpu": _cpu_model(),
        "cpus": cpus,
        "omp_threads": _omp(),
        **figures,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "key": machine_key(cpus, figures["threads"]),
    }
    machines = [
        e
        for e in (cached.get("machines", []) if isinstance(cached, dict) else [])
        if not (e.get("cpus") == cpus and e.get("cpu") == entry["cpu"] and e.get("omp_threads") == _omp())
    ]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"machines": [*machines, entry]}, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # the figures still serve this plan; the next one measures again
    entry["path"] = str(path)
    return entry
