"""The built-in GPU catalog (catalog.toml) and forgiving name lookup.

Pure: reads package data only, imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

from gpuplan.errors import OneProblem
from gpuplan.hardware.profile import GIB, GPUProfile

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

CATALOG_FILE = "catalog.toml"
_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
_VENDORS = ("nvidia", "amd", "cpu")
# Words a device name may carry that say nothing about which device it is.
_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "amd", "instinct", "radeon")


class UnknownGPUError(OneProblem, ValueError):
    """A GPU name matches nothing in the catalog."""

    def __init__(self, name: str, suggestions: list[str], known: list[str] | None = None):
        self.name = name
        self.suggestions = list(suggestions)
        self.known = list(known) if known is not None else names()
        hint = f" Did you mean {' or '.join(repr(s) for s in self.suggestions)}?" if self.suggestions else ""
        super().__init__(
            f"unknown GPU {name!r}.{hint} Known GPUs: {', '.join(self.known)}. "
            'Use one of these names, or gpu = "auto" to detect the GPU of this machine.',
            key="hardware.gpu",
        )


class AmbiguousGPUError(OneProblem, ValueError):
    """A GPU name matches more than one catalog entry."""

    def __init__(self, name: str, candidates: list[str]):
        self.name = name
        self.candidates = list(candidates)
        super().__init__(
            f"GPU name {name!r} is ambiguous: it matches {', '.join(self.candidates)}. Use one of these names.",
            key="hardware.gpu",
        )


class CatalogError(OneProblem, ValueError):
    """catalog.toml itself is malformed (a bug in gpuplan, not a user error)."""


def normalise(name: str) -> str:
    """Lower case without spaces, dashes and underscores: "A100_80GB" -> "a10080gb"."""
    return re.sub(r"[\s\-_]+", "", name.lower())


def _strip_vendor_words(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for word in _VENDOR_WORDS:
            if key.startswith(word) and len(key) > len(word):
                key = key[len(word) :]
                changed = True
    return key


def _profile_from_table(name: str, table: Mapping[str, Any]) -> GPUProfile:
    where = f"{CATALOG_FILE} [gpu.{name!r}]"
    try:
        memory_gib = table["memory_gib"]
        cc = table.get("compute_capability")
        peak = {str(k): float(v) for k, v in table["peak_tflops"].items()}
        profile = GPUProfile(
            name=name,
            vendor=str(table["vendor"]),
            # the driver's total where the catalog has it, else the datasheet figure read as GiB
            memory_bytes=(int(table["usable_mib"]) * 1024**2 if "usable_mib" in table else int(round(float(memory_gib) * GIB))),
            datasheet_gb=float(memory_gib),
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            bf16=bool(table["bf16"]),
            tf32=bool(table["tf32"]),
            fp8=bool(table["fp8"]),
            peak_tflops=peak,
            memory_bandwidth_gbps=float(table["memory_bandwidth_gbps"]),
            interconnect={str(k): float(v) for k, v in table.get("interconnect", {}).items()},
            aliases=tuple(str(a) for a in table.get("aliases", ())),
            matmul_max=float(table["matmul_max"]) if "matmul_max" in table else None,
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CatalogError(f"{where}: missing or malformed field ({exc!r})") from exc
    if profile.vendor not in _VENDORS:
        raise CatalogError(f"{where}: vendor {profile.vendor!r} is not one of {_VENDORS}")
    unknown = set(peak) - set(_DTYPES)
    if unknown:
        raise CatalogError(f"{where}: peak_tflops has unknown dtypes {sorted(unknown)}; allowed {_DTYPES}")
    if "fp32" not in peak:
        raise CatalogError(f"{where}: peak_tflops.fp32 is required")
    return profile


@functools.lru_cache(maxsize=1)
def _read_toml() -> dict[str, Any]:
    text = resources.files("gpuplan.hardware").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    return tomllib.loads(text)


def catalog_table(name: str) -> dict[str, Any]:
    """A top-level table of catalog.toml other than [gpu] ("price", "gpus_per_node"), as read."""
    return dict(_read_toml().get(name, {}))


@functools.lru_cache(maxsize=1)
def _load() -> tuple[dict[str, GPUProfile], dict[str, tuple[str, ...]], dict[str, dict[str, float]]]:
    data = _read_toml()
    profiles = {name: _profile_from_table(name, table) for name, table in data.get("gpu", {}).items()}
    index: dict[str, list[str]] = {}
    for name, profile in profiles.items():
        for key in {normalise(name), *(normalise(a) for a in profile.aliases)}:
            index.setdefault(key, []).append(name)
    clashes = {k: v for k, v in index.items() if len(v) > 1}
    if clashes:
        raise CatalogError(f"{CATALOG_FILE}: names shared by several entries: {clashes}")
    fabrics = {name: {k: float(v) for k, v in t.items()} for name, t in data.get("interconnect", {}).items()}
    return profiles, {k: tuple(v) for k, v in index.items()}, fabrics


def load_catalog() -> dict[str, GPUProfile]:
    """Canonical name -> GPUProfile for every catalog entry (parsed once, then cached)."""
    return dict(_load()[0])


def load_interconnects() -> dict[str, dict[str, float]]:
    """Node-to-node fabrics: name -> {"gbit_per_s", "gbyte_per_s"} per port and direction."""
    return {k: dict(v) for k, v in _load()[2].items()}


def names() -> list[str]:
    """Canonical catalog names, in catalog order."""
    return list(_load()[0])


def candidates(name: str) -> list[str]:
    """Canonical names `name` could mean: exact (normalised) first, then by substring."""
    profiles, index, _ = _load()
    key = normalise(name)
    for k in (key, _strip_vendor_words(key)):
        if k in index:
            return list(index[k])
    if len(key) < 2:
        return []
    found: list[str] = []
    for k in (key, _strip_vendor_words(key)):
        for indexed, owners in index.items():
            if k in indexed:
                found.extend(o for o in owners if o not in found)
        if found:
            break
    return [n for n in profiles if n in found]  # catalog order


def suggest(name: str, n: int = 3) -> list[str]:
    """Canonical names close to `name` (difflib over canonical names and aliases)."""
    _, index, _ = _load()
    close = difflib.get_close_matches(normalise(name), list(index), n=n * 3, cutoff=0.6)
    out: list[str] = []
    for k in close:
        for owner in index[k]:
            if owner not in out:
                out.append(owner)
    return out[:n]


def with_memory(profile: GPUProfile, memory_gib: float) -> GPUProfile:
    """`profile` with its capacity replaced by `memory_gib` GiB."""
    if isinstance(memory_gib, bool) or not isinstance(memory_gib, (int, float)) or not memory_gib > 0:
        raise ValueError(f"memory_gib must be a positive number of GiB, got {memory_gib!r}")
    return dataclasses.replace(profile, memory_bytes=int(round(memory_gib * GIB)))


def lookup(name: str, memory_gib: float | None = None) -> GPUProfile:
    """The catalog profile for `name`, forgiving about case, spaces, "-" and "_".

    Accepts canonical names ("A100-80GB"), aliases including what
    torch.cuda.get_device_name() prints ("NVIDIA A100-SXM4-80GB"), and unique
    fragments ("4090", "mi300"). A fragment that fits several entries ("a100")
    raises AmbiguousGPUError listing them; no match raises UnknownGPUError with
    suggestions. `memory_gib` replaces the catalog capacity.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownGPUError(str(name), [])
    found = candidates(name)
    if not found:
        raise UnknownGPUError(name, suggest(name))
    if len(found) > 1:
        raise AmbiguousGPUError(name, found)
    profile = _load()[0][found[0]]
    return profile if memory_gib is None else with_memory(profile, memory_gib)
