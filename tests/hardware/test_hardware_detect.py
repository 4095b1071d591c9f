"""Detection at the CLI edge: this CPU host, and mapping reported device names."""

from __future__ import annotations

import pytest

from gpuplan.hardware.catalog import load_catalog
from gpuplan.hardware.detect import (
    DeviceReport,
    cpu_profile,
    detect,
    detect_count,
    host_memory_bytes,
    match_device_name,
    profile_for_report,
    profile_from_detected,
)
from gpuplan.hardware.profile import GIB

CATALOG = load_catalog()


def _meminfo_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_host_memory_is_real():
    memory = host_memory_bytes()
    assert 256 * 1024**2 < memory <= _meminfo_total()


@pytest.mark.skipif(_has_gpu(), reason="this test is for hosts without a GPU")
def test_detect_without_gpu_returns_cpu_with_host_ram():
    profile, how = detect()
    assert profile.vendor == "cpu" and profile.name == "cpu"
    assert profile.memory_bytes == host_memory_bytes()
    assert profile.peak_tflops["fp32"] > 0
    assert "no GPU found: CPU" in how and "GiB host RAM" in how
    assert detect_count() == 0


def test_cpu_profile_keeps_catalog_capabilities():
    profile, _ = cpu_profile()
    base = CATALOG["cpu"]
    assert (profile.bf16, profile.tf32, profile.fp8) == (base.bf16, base.tf32, base.fp8) == (False, False, False)
    assert set(profile.peak_tflops) == {"fp32"}


@pytest.mark.parametrize(
    "device_name, expected",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla V100-SXM2-32GB", "V100-32GB"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_match_device_name(device_name, expected):
    assert match_device_name(device_name).name == expected


@pytest.mark.parametrize("device_name", ["NVIDIA H800", "NVIDIA RTX A4000", "NVIDIA L20", "cpu"])
def test_unknown_device_names_match_nothing(device_name):
    assert match_device_name(device_name) is None


def test_ambiguous_device_name_settled_by_memory():
    assert match_device_name("NVIDIA A100", int(79.2 * GIB)).name == "A100-80GB"
    assert match_device_name("NVIDIA A100", int(39.4 * GIB)).name == "A100-40GB"
    assert match_device_name("NVIDIA A100", int(60 * GIB)) is None
    assert match_device_name("NVIDIA A100") is None


def test_matched_report_takes_reported_memory():
    report = DeviceReport("NVIDIA A100-SXM4-80GB", 85_198_045_184, (8, 0), "nvidia", 8, "torch.cuda")
    profile, how = profile_for_report(report)
    assert profile.name == "A100-80GB"
    assert profile.memory_bytes == 85_198_045_184
    assert profile.peak_tflops == CATALOG["A100-80GB"].peak_tflops
    assert "torch.cuda: 8 x 'NVIDIA A100-SXM4-80GB' matched catalog A100-80GB" in how
    assert "79.3 GiB as the driver reports it (catalog 80 GiB)" in how


def test_unknown_hopper_gets_conservative_profile():
    report = DeviceReport("NVIDIA H800", int(94.5 * GIB), (9, 0), "nvidia", 1, "NVML")
    profile, how = profile_for_report(report)
    assert profile.name == "NVIDIA H800"
    assert profile.memory_bytes == int(94.5 * GIB)
    assert profile.compute_capability == (9, 0)
    assert (profile.bf16, profile.tf32, profile.fp8) == (True, True, True)
    older = [p for p in CATALOG.values() if p.vendor == "nvidia" and p.compute_capability <= (9, 0)]
    for dtype, value in profile.peak_tflops.items():
        assert value == min(p.peak_tflops[dtype] for p in older if dtype in p.peak_tflops)
    assert profile.peak_tflops["bf16"] == 70.0  # A10G, the slowest bf16 GPU up to sm_90
    assert profile.memory_bandwidth_gbps == 300.0  # L4
    assert "is not in the catalog" in how and "conservative estimates" in how


@pytest.mark.parametrize("cc, flags", [((7, 5), (False, False, False)), ((8, 6), (True, True, False)), ((8, 9), (True, True, True))])
def test_unknown_nvidia_capabilities_follow_cc(cc, flags):
    report = DeviceReport("NVIDIA Some Card", 8 * GIB, cc, "nvidia", 2, "NVML")
    profile, _ = profile_from_detected(report)
    assert (profile.bf16, profile.tf32, profile.fp8) == flags
    assert ("bf16" in profile.peak_tflops) == flags[0]
    assert ("fp8" in profile.peak_tflops) == flags[2]


def test_unknown_amd_gpu():
    report = DeviceReport("AMD Instinct MI250X", 64 * GIB, None, "amd", 2, "torch.cuda")
    profile, _ = profile_from_detected(report, bf16=True)
    assert profile.vendor == "amd" and profile.compute_capability is None
    assert profile.bf16 and not profile.tf32 and not profile.fp8
    assert profile.is_cuda and profile.is_ampere_or_newer
