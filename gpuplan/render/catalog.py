"""`gpuplan gpus`: the catalog as an aligned table, memory as the datasheet prints it and in GiB like the plan.

A dtype column shows a peak only where the device runs that dtype ("-" otherwise);
prices come with their source in catalog.toml and `gpuplan gpus` says which apply.
"""

from __future__ import annotations

from gpuplan.hardware.catalog import load_catalog
from gpuplan.hardware.prices import catalog_price, gpus_per_node
from gpuplan.hardware.profile import GIB

DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def catalog_rows() -> list[list[str]]:
    rows = []
    for name, g in load_catalog().items():
        cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "-"
        price = catalog_price(name)
        rows.append(
            [
                name,
                g.vendor,
                f"{g.datasheet_gb:g}" if g.datasheet_gb else "-",
                f"{g.memory_bytes / GIB:.1f}" if g.memory_bytes % GIB else f"{g.memory_bytes / GIB:.0f}",
                cc,
                *(_num(g.peak_tflops.get(d)) for d in DTYPES),
                f"{g.memory_bandwidth_gbps:,.0f}",
                str(gpus_per_node(name)) if not g.is_cpu else "-",
                f"{price.usd_per_gpu_hour:.2f}" if price else "-",
            ]
        )
    return rows


def render_catalog() -> list[str]:
    from gpuplan.hardware.userfiles import prices_path, shown_path

    head = ["name", "vendor", "GB", "GiB", "cc", *DTYPES, "GB/s", "per node", "$/GPU-h"]
    rows = [head, *catalog_rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [
        "",
        "TFLOP/s: dense peak per dtype (no sparsity); '-' where the device has no such tensor path.",
        "GB: the datasheet capacity. GiB: what plans use, the total the driver reports where the catalog",
        "has it (nvidia-smi memory.total: GDDR6 cards with ECC on lose 1/16), else the datasheet figure",
        'read as GiB ("80GB" -> 80 GiB). Sources for every figure and price:',
        f"gpuplan/hardware/catalog.toml. Override prices in {shown_path(prices_path())} or",
        "with hardware.price_per_hour in a spec.",
    ]
    return lines
