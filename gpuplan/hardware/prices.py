"""What a GPU-hour costs and how many GPUs a node holds: catalog data with its sources.

Precedence for a price: the spec's hardware.price_per_hour, then the user's prices
file (gpuplan/hardware/userfiles.py), then the catalog's [price."NAME"] table (catalog.toml
cites each row of gpu-reference.json it comes from). Pure: package data only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuplan.hardware.catalog import catalog_table

DEFAULT_GPUS_PER_NODE = 8  # an HGX / DGX board, and the largest common cloud instance


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float
    source: str  # where the figure comes from, printed beside every cost


def catalog_price(name: str) -> Price | None:
    row = catalog_table("price").get(name)
    if row is None:
        return None
    return Price(float(row["usd_per_gpu_hour"]), f"catalog: {row['source']}")


def price_for(name: str, *, spec_price: float | None = None, user_prices: Mapping[str, tuple[float, str]] | None = None) -> Price | None:
    """The price that applies to GPU `name`, or None when nobody knows it."""
    if spec_price is not None:
        return Price(float(spec_price), "the spec's hardware.price_per_hour")
    if user_prices and name in user_prices:
        value, source = user_prices[name]
        return Price(value, source)
    return catalog_price(name)


def gpus_per_node(name: str) -> int:
    return int(catalog_table("gpus_per_node").get(name, DEFAULT_GPUS_PER_NODE))


def split_count(name: str, total: int) -> tuple[int, int] | None:
    """(GPUs per node, nodes) for `total` GPUs of `name`; None when they do not fill whole nodes."""
    per_node = gpus_per_node(name)
    if total <= per_node:
        return total, 1
    if total % per_node:
        return None
    return per_node, total // per_node
