"""The built-in GPU catalog: every entry sane, forgiving lookup, clear errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from gpuplan.hardware.catalog import (
    AmbiguousGPUError,
    CatalogError,
    UnknownGPUError,
    _profile_from_table,
    load_catalog,
    load_interconnects,
    lookup,
    names,
)
from gpuplan.hardware.profile import GIB, GPUProfile

REQUIRED = [  # issue 14: at least 20 accelerators people rent and own
    "T4",
    "V100-16GB",
    "V100-32GB",
    "A10",
    "A10G",
    "L4",
    "L40S",
    "RTX-A6000",
    "RTX-6000-Ada",
    "RTX-3090",
    "RTX-4090",
    "RTX-5090",
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H100-PCIe",
    "H100-NVL",
    "H200",
    "GH200",
    "B200",
    "MI250X",
    "MI300X",
    "cpu",
]
CATALOG = load_catalog()
GPUS = [p for p in CATALOG.values() if p.vendor != "cpu"]
NVIDIA = [p for p in GPUS if p.vendor == "nvidia"]


def test_required_entries_present_in_order():
    assert set(REQUIRED) <= set(names())
    assert names() == list(CATALOG)


@pytest.mark.parametrize("profile", CATALOG.values(), ids=lambda p: p.name)
def test_entry_is_sane(profile: GPUProfile):
    assert profile.memory_bytes > 0 and profile.memory_bytes % (1024**2) == 0
    assert profile.memory_bandwidth_gbps > 0
    assert profile.peak_tflops["fp32"] > 0
    assert all(v > 0 for v in profile.interconnect.values())
    assert set(profile.peak_tflops) <= {"fp32", "tf32", "fp16", "bf16", "fp8"}
    for dtype in ("bf16", "tf32", "fp8"):  # a peak is listed exactly for supported types
        assert (dtype in profile.peak_tflops) == getattr(profile, dtype), dtype
    assert GPUProfile.from_dict(profile.to_dict()) == profile


@pytest.mark.parametrize("profile", NVIDIA, ids=lambda p: p.name)
def test_nvidia_capabilities_follow_compute_capability(profile: GPUProfile):
    cc = profile.compute_capability
    assert cc is not None and cc >= (7, 0)
    assert profile.bf16 == (cc >= (8, 0))
    assert profile.tf32 == (cc >= (8, 0))
    assert profile.fp8 == (cc >= (8, 9))
    assert profile.is_ampere_or_newer == (cc >= (8, 0))


@pytest.mark.parametrize("profile", GPUS, ids=lambda p: p.name)
def test_peaks_are_dense_and_ordered(profile: GPUProfile):
    peak = profile.peak_tflops
    assert peak["fp16"] > peak["fp32"]  # tensor cores
    if "bf16" in peak:
        assert peak["bf16"] == peak["fp16"]
    if "tf32" in peak:
        # vendor tables round each dtype separately (L40S: TF32 183 vs BF16 362.05)
        assert peak["fp32"] <= peak["tf32"] <= peak["fp16"] / 2 * 1.02
    if "fp8" in peak:  # fp8 is twice fp16 dense; a sparse figure pasted by mistake breaks this
        assert peak["fp8"] == pytest.approx(2 * peak["fp16"], rel=0.015)  # L40S: 733 vs 2 x 362.05


def test_capacity_is_what_the_driver_reports_and_the_datasheet_figure_is_kept():
    """Issue 20 item 16: GDDR6 cards with ECC on expose 15/16 of their datasheet "GB" (nvidia-smi)."""
    mib = 1024**2
    for name, total, datasheet in (
        ("T4", 15_360, 16),
        ("A10", 23_028, 24),
        ("L4", 23_034, 24),
        ("L40S", 46_068, 48),
        ("A10G", 23_028, 24),
        ("L40", 46_068, 48),
    ):
        g = CATALOG[name]
        assert (g.memory_bytes, g.datasheet_gb) == (total * mib, datasheet), name
        assert 0.93 < g.memory_bytes / (datasheet * GIB) < 0.94  # the 1/16 ECC carve-out, less a few MiB
    assert CATALOG["L40S"].memory_label == "45.0 GiB usable (48 GB datasheet)"
    assert CATALOG["A100-80GB"].memory_label == "80 GiB"
    assert GPUProfile.from_dict(CATALOG["T4"].to_dict()).datasheet_gb == 16


def test_datasheet_figures():
    assert CATALOG["A100-80GB"].memory_bytes == 80 * GIB
    assert CATALOG["H200"].memory_bytes == 141 * GIB
    assert CATALOG["A100-40GB"].peak_tflops["bf16"] == 312.0
    assert CATALOG["H100-80GB"].peak_tflops["bf16"] == 989.5
    assert CATALOG["T4"].peak_tflops == {"fp32": 8.1, "fp16": 65.0}
    assert CATALOG["MI300X"].compute_capability is None and CATALOG["MI300X"].vendor == "amd"
    assert CATALOG["cpu"].vendor == "cpu" and not CATALOG["cpu"].is_cuda


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a100 80gb", "A100-80GB"),
        ("A100_80GB", "A100-80GB"),
        ("a100-sxm4-80gb", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("h100", "H100-80GB"),
        ("H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("Tesla T4", "T4"),
        ("t4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("4090", "RTX-4090"),
        ("rtx_3090", "RTX-3090"),
        ("AMD Instinct MI300X", "MI300X"),
        ("mi300", "MI300X"),
        ("  H200 ", "H200"),
        ("b200", "B200"),
        ("CPU", "cpu"),
    ],
)
def test_forgiving_lookup(name, expected):
    assert lookup(name).name == expected


@pytest.mark.parametrize("profile", CATALOG.values(), ids=lambda p: p.name)
def test_every_alias_finds_its_entry(profile):
    for alias in (profile.name, *profile.aliases):
        assert lookup(alias).name == profile.name


@pytest.mark.parametrize(
    "name, candidates",
    [
        ("a100", ["A100-40GB", "A100-80GB"]),
        ("v100", ["V100-16GB", "V100-32GB"]),
        ("rtx", ["RTX-A6000", "RTX-6000-Ada", "RTX-3090", "RTX-4090", "RTX-5090"]),
    ],
)
def test_ambiguous_name_lists_candidates(name, candidates):
    with pytest.raises(AmbiguousGPUError, match=f"'{name}' is ambiguous: it matches {', '.join(candidates)}") as err:
        lookup(name)
    assert err.value.candidates == candidates
    assert isinstance(err.value, ValueError)


def test_unknown_name_suggests():
    with pytest.raises(UnknownGPUError, match=r"unknown GPU 'a1000'\. Did you mean 'A100-80GB'") as err:
        lookup("a1000")
    assert err.value.name == "a1000"
    assert "A100-40GB" in err.value.suggestions
    assert err.value.known == names()
    assert isinstance(err.value, ValueError)
    assert "Known GPUs: T4, " in str(err.value)


@pytest.mark.parametrize("name", ["tpu-v5", "", "   ", "x"])
def test_unknown_without_close_match(name):
    with pytest.raises(UnknownGPUError, match="Known GPUs"):
        lookup(name)


def test_memory_override():
    base = lookup("A100-80GB")
    small = lookup("a100 80gb", memory_gib=79.2)
    assert small.memory_bytes == round(79.2 * GIB)
    assert dataclasses.replace(small, memory_bytes=base.memory_bytes) == base
    assert lookup("A100-80GB").memory_bytes == 80 * GIB  # the cache is not modified


@pytest.mark.parametrize("bad", [0, -1, True, "80"])
def test_memory_override_rejects_nonsense(bad):
    with pytest.raises(ValueError, match="memory_gib must be a positive number of GiB"):
        lookup("H200", memory_gib=bad)


def test_load_catalog_returns_a_copy():
    catalog = load_catalog()
    catalog.pop("H200")
    assert "H200" in load_catalog()


def test_interconnects():
    fabrics = load_interconnects()
    assert set(fabrics) == {"InfiniBand-HDR", "InfiniBand-NDR", "Ethernet-100G"}
    for fabric in fabrics.values():
        assert fabric["gbyte_per_s"] == fabric["gbit_per_s"] / 8


def test_malformed_table_names_entry():
    with pytest.raises(CatalogError, match=r"\[gpu.'X1'\]: missing or malformed field"):
        _profile_from_table("X1", {"vendor": "nvidia", "memory_gib": 8})
    table = {
        "vendor": "nvidia",
        "memory_gib": 8,
        "bf16": False,
        "tf32": False,
        "fp8": False,
        "memory_bandwidth_gbps": 1.0,
        "peak_tflops": {"fp32": 1.0, "int4": 9.0},
    }
    with pytest.raises(CatalogError, match="unknown dtypes"):
        _profile_from_table("X1", table)


def test_catalog_and_throughput_do_not_import_torch():
    code = (
        "import sys, gpuplan.hardware.catalog as c, gpuplan.hardware.detect, gpuplan.plan.estimate.throughput;"
        "c.lookup('h100');"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpus_table_is_aligned_and_shows_only_existing_dtypes():
    from gpuplan.render.catalog import DTYPES, render_catalog

    lines = render_catalog()
    head = lines[0].split()
    assert head[:5] == ["name", "vendor", "GB", "GiB", "cc"] and head[5:10] == list(DTYPES)
    rows = {line.split()[0]: line for line in lines[2:] if line and not line[0].isspace() and line.split()[0] in CATALOG}
    assert set(rows) == set(CATALOG)
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule line up
    t4 = rows["T4"].split()
    # datasheet 16 GB, 15 GiB usable (ECC carve-out); no tf32, bf16, fp8 on Turing
    assert t4[2:4] == ["16", "15"] and t4[5:10] == ["8.1", "-", "65", "-", "-"]
    h100 = rows["H100-80GB"].split()
    assert h100[2:4] == ["80", "80"] and h100[5:10] == ["67", "494", "990", "990", "1,979"] and h100[-1] == "3.99"


def test_a_cards_measured_gemm_maximum_is_read_and_travels_with_it():
    """matmul_max (the fastest measured GEMM over the dense 16-bit peak) is on the cards that are not their class's
    reference, within what a card can reach, and survives the profile's and the plan's dicts."""
    from gpuplan.plan.estimate.step_time import constants as K
    from gpuplan.plan.sections import HardwareSection

    catalog = load_catalog()
    measured = {n: p.matmul_max for n, p in catalog.items() if p.matmul_max is not None}
    assert {"L4", "L40S", "H100-PCIe", "T4"} <= set(measured)
    # the reference cards of the classes with a MAMF keep the class's own figure
    assert not {"A100-80GB", "A100-40GB", "H100-80GB", "RTX-3090", "B200"} & set(measured)
    assert all(0.3 < v < 1.2 for v in measured.values()), measured
    l4 = catalog["L4"]
    assert GPUProfile.from_dict(l4.to_dict()) == l4 and l4.to_dict()["matmul_max"] == 0.586
    assert "matmul_max" not in catalog["A100-80GB"].to_dict()  # None is left out, as the plan's section leaves it
    assert HardwareSection.from_dict(l4.to_dict()).matmul_max == 0.586
    assert "matmul_max" not in HardwareSection.from_dict(catalog["A100-80GB"].to_dict()).to_dict()
    assert K.arch_class(l4) == K.arch_class(catalog["RTX-4090"])  # both Ada: the L4 runs at its own fraction
