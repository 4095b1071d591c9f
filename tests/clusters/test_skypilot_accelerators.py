"""SkyPilot's job lists every GPU type compare says fits at the plan's nodes x GPUs, each with its own time and plan
(gpuplan/clusters/accelerators.py); the other engines keep the plan's GPU; a node applies the plan for its GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuplan.cli.apply import plan_for_this_gpu
from gpuplan.cli.main import main
from gpuplan.clusters.engine import engine_for
from gpuplan.clusters.job import job_for, plan_for_gpu
from gpuplan.clusters.skypilot import SKYPILOT_ACCELERATORS, TASK_FILE, planned_seconds
from gpuplan.hardware.catalog import load_catalog, lookup
from gpuplan.hardware.prices import gpus_per_node
from gpuplan.plan.build import plan_file
from gpuplan.plan.compare import compare_row, sort_rows
from gpuplan.plan.fingerprint import stale_reasons
from gpuplan.plan.types import Plan
from gpuplan.spec.load import load_toml
from tests.helpers.cluster_launches import BUCKET, IMAGE, MULTI_NODE_SPEC, cluster_spec, launch_for
from tests.helpers.planning import ENV, SPECS


@pytest.fixture(scope="module")
def plan():
    return plan_file(MULTI_NODE_SPEC, environment=ENV)


@pytest.fixture(scope="module")
def job(plan):
    return job_for(plan, launch_for(plan, "skypilot"), environment=ENV, prices={}, calibrations=[])


def compare_fits(spec: Path, per_node: int, nodes: int) -> list[dict]:
    """compare's own fitting rows at per_node x nodes GPUs, in its order: the NVIDIA GPUs SkyPilot names whose nodes
    hold per_node (there compare's split_count gives per_node x nodes, plan/compare.py)."""
    loaded = load_toml(spec)
    named = [g for g, p in load_catalog().items() if g in SKYPILOT_ACCELERATORS and p.vendor == "nvidia" and gpus_per_node(g) >= per_node]
    rows = sort_rows([compare_row(loaded, g, per_node * nodes, environment=ENV, prices={}, calibrations=[]) for g in named], "cost")
    assert all(r["gpus_per_node"] == per_node and r["nodes"] == nodes for r in rows)
    return [r for r in rows if r["fits"]]


def assert_lists_compares_fits(job, fits: list[dict]) -> None:
    assert job.resources.accelerators == tuple(r["gpu"] for r in fits)
    # each accelerator carries its own planned run time to SkyPilot's estimator, not the plan GPU's
    assert planned_seconds(job) == {SKYPILOT_ACCELERATORS[r["gpu"]]: pytest.approx(r["run_time_s"]) for r in fits}
    assert len(set(planned_seconds(job).values())) == len(fits)
    task = yaml.safe_load(engine_for("skypilot").render(job)[TASK_FILE])
    assert task["num_nodes"] == job.nodes
    per_node = job.resources.gpus_per_node
    acc = task["resources"]["accelerators"]
    got = list(acc.items()) if isinstance(acc, dict) else [tuple(acc.split(":"))]
    assert got == [(SKYPILOT_ACCELERATORS[r["gpu"]], per_node if isinstance(acc, dict) else str(per_node)) for r in fits]


def test_the_listed_gpus_are_those_compare_says_fit_in_its_order_each_with_its_time(job):
    fits = compare_fits(MULTI_NODE_SPEC, 8, 2)
    assert len(fits) > 10  # at 2 x 8 with FSDP every NVIDIA GPU with nodes of 8 fits this 8B run
    assert job.resources.gpu == "H100-80GB" and "H100-80GB" in job.resources.accelerators
    assert_lists_compares_fits(job, fits)


def test_gpus_the_run_does_not_fit_are_left_out_with_what_it_needs(tmp_path):
    spec = tmp_path / "one.toml"  # the 24 GB shipped spec as LoRA on one H100: the 16 GB cards cannot hold it
    spec.write_text(
        (SPECS / "mistral-7b-24gb.toml")
        .read_text()
        .replace('config = "models/', f'config = "{SPECS}/models/')
        .replace('train_files = ["data/', f'train_files = ["{SPECS}/data/')
        .replace('gpu = "RTX-4090"', 'gpu = "H100-80GB"')
        .replace('task = "causal-lm"', 'task = "causal-lm"\nmethod = "lora"')
        + '\n[launch]\ntarget = "skypilot"\nimage = "ghcr.io/example/gpuplan:0.1"\n'
    )
    plan = plan_file(spec, environment=ENV)
    job = job_for(plan, environment=ENV, prices={}, calibrations=[])
    fits = compare_fits(spec, 1, 1)
    assert_lists_compares_fits(job, fits)
    assert job.choice is not None
    no_fit = {g: why for g, why in job.choice.left_out.items() if why.startswith("does not fit: needs ")}
    assert {"T4", "V100-16GB"} <= set(no_fit), job.choice.left_out
    assert set(no_fit).isdisjoint(job.resources.accelerators) and len(job.resources.accelerators) == len(fits) > 5


def test_every_other_gpu_is_left_out_with_its_reason(plan, job):
    choice = job.choice
    assert choice is not None
    gpus = {g for g, p in load_catalog().items() if not p.is_cpu}
    assert set(job.resources.accelerators) | set(choice.left_out) == gpus
    assert not set(job.resources.accelerators) & set(choice.left_out)
    assert choice.left_out["H100-PCIe"] == "SkyPilot's catalogs do not name it apart from another GPU"
    assert choice.left_out["MI300X"] == "an AMD GPU: launch.image is built for the plan's NVIDIA GPUs"
    assert choice.left_out["GH200"] == "its nodes hold 1 GPU, the plan puts 8 on each"
    lines = "\n".join(job.lines())
    assert "  accelerators: " + job.resources.accelerators[0] in lines
    assert "the GPU types that fit 2 x 8, cheapest run first (as gpuplan compare ranks them)" in lines
    assert f"left out ({len(choice.left_out)}): " in lines
    assert job.to_dict()["accelerators"]["left_out"] == dict(choice.left_out)


@pytest.mark.parametrize("target", ["slurm", "kubernetes", "ray"])
def test_the_other_engines_keep_the_plans_gpu(plan, target):
    job = job_for(plan, None if target == "slurm" else launch_for(plan, target))  # the spec's own [launch] is Slurm's
    assert job.resources.accelerators == ("H100-80GB",) and job.choice is None and job.gpu_plans == {}
    assert "run_time_s_by_gpu" not in job.planned


def test_an_edited_spec_lists_only_the_plans_gpu(plan):
    edited = Plan.from_dict({**plan.to_dict(), "spec_sha256": "0" * 64})  # the spec's bytes are not the planned ones
    job = job_for(edited, launch_for(edited, "skypilot"), environment=ENV, prices={}, calibrations=[])
    assert job.resources.accelerators == ("H100-80GB",)
    assert job.choice is not None and "was edited since the plan was made" in (job.choice.note or "")


def skypilot_spec(tmp_path: Path) -> Path:
    return cluster_spec(tmp_path, f'target = "skypilot"\nstorage_bucket = "{BUCKET}"\nimage = "{IMAGE}"', name="sky")


def test_the_job_dir_holds_a_plan_per_gpu_and_a_node_applies_the_one_for_its_gpu(tmp_path, capsys):
    assert main(["apply", str(skypilot_spec(tmp_path)), "--dry-run"]) == 0, capsys.readouterr().err
    job_dir = tmp_path / "shared" / "runs" / "llama" / "gpuplan-job"
    task = yaml.safe_load((job_dir / TASK_FILE).read_text())
    assert "A100-80GB" in task["resources"]["accelerators"]
    main_plan = job_dir / "plan.json"
    other = Path(plan_for_gpu(str(main_plan), "A100-80GB"))
    assert other.name == "plan.A100-80GB.json" and other.is_file()
    a100 = lookup("A100-80GB")
    saved = Plan.from_dict(json.loads(main_plan.read_text()))
    assert stale_reasons(saved, spec_sha256_now=saved.spec_sha256, hardware_now=a100.to_dict(), environment_now=None) == [
        "planned for H100-80GB, this machine has A100-80GB"
    ]
    # on a node with an A100 the job's own apply takes the A100's plan, which is current there
    chosen = plan_for_this_gpu(main_plan, saved, lambda: a100)
    assert chosen.hardware.name == "A100-80GB" and chosen.resolved.hardware.nodes == 2 and chosen.resolved.hardware.count == 8
    assert Path(chosen.spec_path or "").parent == job_dir  # checked against the spec's copy in the job dir
    assert stale_reasons(chosen, spec_sha256_now=saved.spec_sha256, hardware_now=a100.to_dict(), environment_now=None) == []
    assert chosen.throughput.run_time_s != saved.throughput.run_time_s
    assert plan_for_this_gpu(main_plan, saved, lambda: lookup("H100-80GB")) is saved
