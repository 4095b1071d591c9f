"""Vendor-aware words for what a plan prints (issue 11 item 13: not every GPU is NVIDIA's).

NVIDIA calls its matrix units tensor cores and ships nvidia-smi; AMD Instinct GPUs have
matrix cores (CDNA whitepapers) and ship rocm-smi / amd-smi.
"""

from __future__ import annotations

from gpuplan.hardware.profile import GPUProfile


def matrix_units(gpu: GPUProfile) -> str:
    return "matrix cores" if gpu.vendor == "amd" else "tensor cores"


def smi(vendor: str | None) -> str:
    return {"amd": "rocm-smi", "cpu": "process"}.get(vendor or "", "nvidia-smi")


def bf16_capability(gpu: GPUProfile) -> str:
    """Why a GPU has (or lacks) bf16, in the vendor's terms."""
    if gpu.vendor == "amd":
        return "AMD CDNA2 and newer"
    return "compute capability >= 8.0"
