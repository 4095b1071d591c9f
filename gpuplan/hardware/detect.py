"""Find the accelerator of this machine (the CLI edge only; docs/design.md principle 4).

Order: NVML (the `pynvml` module of nvidia-ml-py, if importable), then torch.cuda
(if torch is installed; imported inside the function), then the CPU. The plan path
never calls this module: it plans for whatever GPUProfile it is given.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass

from gpuplan.hardware.catalog import candidates, load_catalog, lookup
from gpuplan.hardware.profile import GIB, GPUProfile

# Peak fp32 per logical CPU, TFLOP/s: 2 FMA units x 16 fp32 lanes (AVX-512) x 2 flops
# x 2.5 GHz = 0.16; half with AVX2 (8 lanes). A rough nominal figure: a 2048^2 fp32
# matmul measured 0.157 TFLOP/s per CPU on a Sapphire Rapids VM (gpuplan dev box).
_CPU_TFLOPS_AVX512 = 0.16
_CPU_TFLOPS_AVX2 = 0.08
# Memory-match tolerance when a detected name fits several catalog entries.
_MEMORY_MATCH_TOLERANCE = 0.10


@dataclass(frozen=True)
class DeviceReport:
    """What a probe saw on device 0 (count: devices on this node)."""

    name: str
    memory_bytes: int
    compute_capability: tuple[int, int] | None
    vendor: str  # "nvidia" | "amd"
    count: int
    source: str  # "NVML" | "torch.cuda"


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def host_memory_bytes() -> int:
    """Physical RAM of the host, capped by this process's cgroup memory limit if lower."""
    total: int | None = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemTotal:"):
                        total = int(line.split()[1]) * 1024  # kB
        except OSError:
            pass
    if total is None or total <= 0:
        total = load_catalog()["cpu"].memory_bytes  # the nominal catalog figure
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        limit = _read_int(limit_file)
        if limit is not None and 0 < limit < total:
            total = limit
    return total


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return " avx512f" in line
    except OSError:
        pass
    return False


def cpu_profile() -> tuple[GPUProfile, str]:
    """The catalog "cpu" entry with this host's RAM, and the fp32 peak and memory bandwidth
    measured on it (hardware/cpu_probe.py, cached); the nominal per-CPU figure without torch."""
    from gpuplan.hardware.cpu_probe import cpu_figures

    n = _cpu_count()
    memory = host_memory_bytes()
    figures = cpu_figures(n)
    if figures is not None:
        profile = dataclasses.replace(
            load_catalog()["cpu"],
            memory_bytes=memory,
            peak_tflops={"fp32": round(figures["fp32_tflops"], 4)},
            memory_bandwidth_gbps=round(figures["gbyte_per_s"], 1),
        )
        return profile, (
            f"no GPU found: CPU, {memory / GIB:.1f} GiB host RAM; fp32 matmul "
            f"{figures['fp32_tflops']:.3f} TFLOP/s and {figures['gbyte_per_s']:.1f} GB/s measured on "
            f"{n} CPUs (gpuplan cpu probe, cached)"
        )
    per_cpu = _CPU_TFLOPS_AVX512 if _has_avx512() else _CPU_TFLOPS_AVX2
    profile = dataclasses.replace(load_catalog()["cpu"], memory_bytes=memory, peak_tflops={"fp32": round(n * per_cpu, 3)})
    how = (
        f"no GPU found: CPU, {memory / GIB:.1f} GiB host RAM; fp32 peak {n} CPUs x "
        f"{per_cpu} TFLOP/s ({'AVX-512' if per_cpu == _CPU_TFLOPS_AVX512 else 'AVX2'}, nominal: torch not installed)"
    )
    return profile, how


def match_device_name(device_name: str, memory_bytes: int | None = None) -> GPUProfile | None:
    """The catalog entry for a name torch/NVML prints ("NVIDIA A100-SXM4-80GB"), or None.

    When the name fits several entries, the one whose catalog memory is within 10% of
    `memory_bytes` is taken; otherwise None (the caller builds a profile instead).
    """
    found = [n for n in candidates(device_name) if n != "cpu"]
    catalog = load_catalog()
    if len(found) > 1 and memory_bytes:
        found = [n for n in found if abs(catalog[n].memory_bytes - memory_bytes) <= _MEMORY_MATCH_TOLERANCE * catalog[n].memory_bytes]
    return catalog[found[0]] if len(found) == 1 else None


def profile_from_detected(report: DeviceReport, bf16: bool | None = None) -> tuple[GPUProfile, str]:
    """A profile for a GPU that is not in the catalog, from what the probe saw.

    Capabilities follow the compute capability (bf16 and tf32 from sm_80, fp8 from
    sm_89); AMD gets bf16 from `bf16` (torch.cuda.is_bf16_supported()), no tf32 and
    no fp8. Peak TFLOP/s and bandwidth are unknown, so each is the LOWEST of the
    catalog GPUs of the same vendor and the same or an older compute capability:
    a conservative estimate, said so in the returned text.
    """
    catalog = load_catalog()
    cc = report.compute_capability
    gpus = [p for p in catalog.values() if not p.is_cpu]
    if report.vendor == "nvidia" and cc is not None:
        has = {"bf16": cc >= (8, 0), "tf32": cc >= (8, 0), "fp8": cc >= (8, 9)}
        # every NVIDIA catalog entry has a compute capability (tests/hardware/test_hardware_catalog.py)
        nvidia = [p for p in gpus if p.vendor == "nvidia"]
        pool = [p for p in nvidia if p.compute_capability is not None and p.compute_capability <= cc] or nvidia
        basis = f"catalog NVIDIA GPUs of compute capability <= {cc[0]}.{cc[1]}"
    else:
        has = {"bf16": bool(bf16), "tf32": False, "fp8": False}
        pool = gpus
        basis = "all catalog GPUs"
    wanted = ["fp32", "fp16"] + [d for d in ("tf32", "bf16", "fp8") if has[d]]
    peak = {}
    for dtype in wanted:
        values = [p.peak_tflops[dtype] for p in pool if dtype in p.peak_tflops]
        if values:
            peak[dtype] = min(values)
    profile = GPUProfile(
        name=report.name,
        vendor=report.vendor,
        memory_bytes=report.memory_bytes,
        compute_capability=cc if report.vendor == "nvidia" else None,
        bf16=has["bf16"],
        tf32=has["tf32"],
        fp8=has["fp8"],
        peak_tflops=peak,
        memory_bandwidth_gbps=min(p.memory_bandwidth_gbps for p in pool),
        interconnect={},
        aliases=(report.name,),
    )
    cc_text = f"sm_{cc[0]}{cc[1]}, " if cc and report.vendor == "nvidia" else ""
    how = (
        f"{report.source}: {report.count} x {report.name!r} ({cc_text}{report.memory_bytes / GIB:.1f} GiB) "
        f"is not in the catalog; peak TFLOP/s and memory bandwidth are conservative "
        f"estimates (the lowest of {basis})"
    )
    return profile, how


def _probe_nvml() -> DeviceReport | None:
    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no driver / no device on this host
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count < 1:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        try:
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            cc: tuple[int, int] | None = (int(major), int(minor))
        except Exception:  # very old drivers lack the call
            cc = None
        return DeviceReport(name, memory, cc, "nvidia", int(count), "NVML")
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _probe_torch() -> tuple[DeviceReport, bool] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    amd = getattr(torch.version, "hip", None) is not None
    report = DeviceReport(
        name=torch.cuda.get_device_name(0),
        memory_bytes=int(props.total_memory),
        # On ROCm, major/minor are the gfx version, not an NVIDIA compute capability.
        compute_capability=None if amd else (int(props.major), int(props.minor)),
        vendor="amd" if amd else "nvidia",
        count=int(torch.cuda.device_count()),
        source="torch.cuda",
    )
    return report, bool(torch.cuda.is_bf16_supported())


def _probe() -> tuple[DeviceReport, bool | None] | None:
    report = _probe_nvml()
    if report is not None:
        return report, None
    return _probe_torch()


def profile_for_report(report: DeviceReport, bf16: bool | None = None) -> tuple[GPUProfile, str]:
    """The catalog profile for what a probe saw (with the reported memory), or a built one."""
    matched = match_device_name(report.name, report.memory_bytes)
    if matched is None:
        return profile_from_detected(report, bf16)
    profile = lookup(matched.name, memory_gib=report.memory_bytes / GIB)
    how = (
        f"{report.source}: {report.count} x {report.name!r} matched catalog {matched.name}; "
        f"memory {report.memory_bytes / GIB:.1f} GiB as the driver reports it "
        f"(catalog {matched.memory_bytes / GIB:.0f} GiB)"
    )
    return profile, how


def detect() -> tuple[GPUProfile, str]:
    """(profile of GPU 0, how it was found); the CPU profile when there is no GPU."""
    probed = _probe()
    if probed is None:
        return cpu_profile()
    return profile_for_report(*probed)


def detect_count() -> int:
    """Accelerators on this node (0 without any)."""
    probed = _probe()
    return 0 if probed is None else probed[0].count
