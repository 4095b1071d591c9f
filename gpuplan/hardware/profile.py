"""GPUProfile: the hardware as an input to planning (docs/design.md principle 4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuplan.units import GIB

__all__ = ["GIB", "GPUProfile"]


@dataclass(frozen=True)
class GPUProfile:
    """One accelerator (or "cpu"). Figures are vendor datasheet values, dense (no sparsity)."""

    name: str
    vendor: str  # "nvidia" | "amd" | "cpu"
    memory_bytes: int
    compute_capability: tuple[int, int] | None  # NVIDIA sm version; None for AMD/CPU
    bf16: bool
    tf32: bool
    fp8: bool
    peak_tflops: Mapping[str, float]  # dtype ("fp32", "tf32", "fp16", "bf16", "fp8") -> dense TFLOP/s
    memory_bandwidth_gbps: float  # GB/s
    interconnect: Mapping[str, float] = field(default_factory=dict)  # "nvlink"/"pcie" -> GB/s per direction
    aliases: tuple[str, ...] = ()
    datasheet_gb: float | None = None  # the capacity as the datasheet prints it (display); memory_bytes is usable
    # the fastest GEMM measured on this SKU, as a fraction of its dense 16-bit tensor peak, where it is not its
    # architecture class's reference card (plan/estimate/step_time/constants.py MAMF): a lower-power card of the class
    # (L4, L40S, H100 PCIe) reaches less of its datasheet than the card the class's constants were fitted on
    matmul_max: float | None = None

    @property
    def memory_label(self) -> str:
        """The capacity for messages: usable GiB, and the datasheet figure where it differs."""
        gib = self.memory_bytes / GIB
        if self.datasheet_gb is None or abs(self.datasheet_gb - gib) < 0.05:
            return f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f} GiB"
        return f"{gib:.1f} GiB usable ({self.datasheet_gb:g} GB datasheet)"

    @property
    def is_cpu(self) -> bool:
        return self.vendor == "cpu"

    @property
    def a_name(self) -> str:
        """The name with its article, read as spoken: "an A100-80GB", "an MI300X", "a T4", "a V100-16GB"."""
        return ("an " if self.name[:1] in "AEFHILMNORSX" else "a ") + self.name

    @property
    def is_cuda(self) -> bool:
        return self.vendor in ("nvidia", "amd")  # ROCm builds of torch expose HIP as "cuda"

    @property
    def is_ampere_or_newer(self) -> bool:
        if self.vendor == "amd":
            return self.bf16
        return self.compute_capability is not None and self.compute_capability >= (8, 0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        d["peak_tflops"] = dict(self.peak_tflops)
        d["interconnect"] = dict(self.interconnect)
        d["aliases"] = list(self.aliases)
        if self.matmul_max is None:
            del d["matmul_max"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GPUProfile:
        cc = d.get("compute_capability")
        return cls(
            name=d["name"],
            vendor=d["vendor"],
            memory_bytes=int(d["memory_bytes"]),
            compute_capability=tuple(cc) if cc else None,
            bf16=bool(d["bf16"]),
            tf32=bool(d["tf32"]),
            fp8=bool(d["fp8"]),
            peak_tflops=dict(d["peak_tflops"]),
            memory_bandwidth_gbps=float(d["memory_bandwidth_gbps"]),
            interconnect=dict(d.get("interconnect", {})),
            aliases=tuple(d.get("aliases", ())),
            datasheet_gb=d.get("datasheet_gb"),
            matmul_max=d.get("matmul_max"),
        )
