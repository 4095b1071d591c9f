"""Bytes as people read them: one GIB and one MIB constant, and their formatters, for the whole package.

GiB (2**30 bytes) as torch.cuda.memory_allocated and nvidia-smi's MiB columns count
(IEC 80000-13 binary prefixes); GPU datasheets' "80 GB" are GiB too (gpu-reference.md).
"""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2


def gib(n: float | None, digits: int = 1, unknown: str = "?") -> str:
    """`n` bytes as "12.3 GiB"; `unknown` when n is None."""
    return unknown if n is None else f"{n / GIB:.{digits}f} GiB"


def mib(n: float | None, digits: int = 0, unknown: str = "?") -> str:
    """`n` bytes as "336 MiB"; `unknown` when n is None."""
    return unknown if n is None else f"{n / MIB:.{digits}f} MiB"
