"""The GPU types a SkyPilot job may run on: every catalog GPU that fits the spec at the plan's nodes x GPUs.

SkyPilot's `resources.accelerators` may name several GPU types; its optimizer then launches the one
whose cost is lowest (sky/optimizer.py). gpuplan plans the spec on each catalog GPU SkyPilot has a
name for (clusters/skypilot.py SKYPILOT_ACCELERATORS) at the plan's own GPUs per node and nodes, with
the machinery of `gpuplan compare` (plan/compare.py plan_row: the same rows, the same fit search),
keeps those that fit, and orders them as compare does (sort_rows, by cost). Each listed GPU carries its
own plan: its run time is what SkyPilot's time estimator gives it (skypilot.py planned_seconds), and the
plan is saved in the job dir as plan.<GPU>.json, which the node's `gpuplan apply --in-job` takes when
it finds that GPU (job.py plan_for_gpu): a plan made for an H100 is stale on an A100.

Left out, each with its reason: the GPUs that do not fit, those SkyPilot cannot name apart, those of
another vendor (launch.image is one build of torch, CUDA or ROCm), and those whose nodes hold fewer GPUs
than the plan puts on one (hardware/prices.py gpus_per_node).
Pure: no torch; one plan per GPU (~10 ms each).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.plan.types import Plan
from gpuplan.units import GIB

# gpuplan's catalog name -> SkyPilot's accelerator name, as its catalogs spell them (skypilot 0.14.1,
# sky/catalog/data_fetchers/fetch_aws.py, fetch_gcp.py, fetch_lambda_cloud.py, fetch_runpod.py: "H100",
# "A100-80GB", "A100" is the 40 GB A100, "V100" the 16 GB one, "RTXA6000", "RTX6000-Ada", ...). GPUs
# SkyPilot does not name apart (H100 PCIe / NVL are not "H100", SXM) are absent: refused with a fix.
SKYPILOT_ACCELERATORS: dict[str, str] = {
    "T4": "T4",
    "V100-16GB": "V100",
    "V100-32GB": "V100-32GB",
    "A10": "A10",
    "A10G": "A10G",
    "L4": "L4",
    "L40": "L40",
    "L40S": "L40S",
    "RTX-A6000": "RTXA6000",
    "RTX-6000-Ada": "RTX6000-Ada",
    "RTX-3090": "RTX3090",
    "RTX-4090": "RTX4090",
    "RTX-5090": "RTX5090",
    "A100-40GB": "A100",
    "A100-80GB": "A100-80GB",
    "H100-80GB": "H100",
    "H200": "H200",
    "GH200": "GH200",
    "B200": "B200",
    "MI300X": "MI300X",
}


@dataclass(frozen=True)
class Accelerator:
    """A GPU type the job lists, with the plan it runs there."""

    gpu: str  # catalog name
    run_time_s: float | None
    cost_usd: float | None
    plan: Plan

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "run_time_s": self.run_time_s, "cost_usd": self.cost_usd}


@dataclass(frozen=True)
class Choice:
    """The GPU types listed (the plan's own among them), in compare's order, and those left out with why."""

    listed: tuple[Accelerator, ...]
    left_out: Mapping[str, str]  # catalog name -> reason
    note: str | None = None  # why only the plan's GPU is listed, where the spec could not be planned again

    def to_dict(self) -> dict[str, Any]:
        return {
            "listed": [a.to_dict() for a in self.listed],
            "left_out": dict(self.left_out),
            **({"note": self.note} if self.note else {}),
        }


def own_only(plan: Plan, note: str) -> Choice:
    t = plan.throughput
    return Choice((Accelerator(str(plan.hardware.name), t.run_time_s, t.cost_usd, plan),), {}, note)


def fitting_accelerators(
    plan: Plan,
    *,
    environment: Any = None,
    prices: Mapping[str, tuple[float, str]] | None = None,
    calibrations: Sequence[Mapping[str, Any]] | None = None,
) -> Choice:
    """The catalog GPUs SkyPilot may run `plan`'s job on; `environment` None: this machine's packages."""
    from gpuplan.hardware.catalog import load_catalog
    from gpuplan.hardware.prices import gpus_per_node
    from gpuplan.plan.compare import default_gpus, plan_row, sort_rows
    from gpuplan.spec.load import load_toml

    own = str(plan.hardware.name)
    path = plan.spec_path
    if not path or not Path(path).is_file():
        return own_only(plan, f"the spec {path} is not there to plan on other GPUs")
    if plan.spec_sha256 and hashlib.sha256(Path(path).read_bytes()).hexdigest() != plan.spec_sha256:
        return own_only(plan, f"the spec {path} was edited since the plan was made")
    if environment is None:
        from gpuplan.plan.inputs.environment import local_environment

        environment = local_environment()
    loaded = load_toml(path)
    per_node, nodes = plan.resolved.hardware.count, plan.resolved.hardware.nodes
    left_out: dict[str, str] = {}
    rows, plans = [], {}
    catalog = load_catalog()
    for gpu in default_gpus():
        held = gpus_per_node(gpu)
        if gpu not in SKYPILOT_ACCELERATORS:
            left_out[gpu] = "SkyPilot's catalogs do not name it apart from another GPU"
        elif catalog[gpu].vendor != plan.hardware.vendor:  # launch.image holds one build of torch: CUDA or ROCm
            left_out[gpu] = (
                f"an {catalog[gpu].vendor.upper()} GPU: launch.image is built for the plan's {str(plan.hardware.vendor).upper()} GPUs"
            )
        elif gpu != own and held < per_node:
            left_out[gpu] = f"its nodes hold {held} GPU{'s' if held != 1 else ''}, the plan puts {per_node} on each"
        else:
            row, one = plan_row(loaded, gpu, per_node, nodes, environment=environment, prices=prices, calibrations=calibrations)
            if one is None:
                left_out[gpu] = not_fit_reason(row)
            else:
                rows.append(row)
                plans[gpu] = plan if gpu == own else one
    listed = [Accelerator(r["gpu"], r["run_time_s"], r["cost_usd"], plans[r["gpu"]]) for r in sort_rows(rows, "cost")]
    if own not in plans:  # planned with what compare does not redo (a detected GPU's own memory): it fits by the plan
        left_out.pop(own, None)
        listed.insert(0, own_only(plan, "").listed[0])
    return Choice(tuple(listed), left_out)


def not_fit_reason(row: Mapping[str, Any]) -> str:
    if row.get("needs_bytes"):
        return f"does not fit: needs {row['needs_bytes'] / GIB:.1f} GiB of {row['capacity_bytes'] / GIB:.0f}"
    return f"does not plan: {row.get('error') or 'no fit'}"


__all__ = ["SKYPILOT_ACCELERATORS", "Accelerator", "Choice", "fitting_accelerators"]
