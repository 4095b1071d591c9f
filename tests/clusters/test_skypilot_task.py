"""SkyPilot hand-off (gpuplan/clusters/skypilot.py), read by SkyPilot itself.

SkyPilot runs in a subprocess whose HOME is the test's tmp_path, under the interpreter GPUPLAN_TEST_SKYPILOT_PYTHON
names (.ci/run makes a venv of its own for it: skypilot 0.14 pins click<8.2, which huggingface-hub 2.x
refuses, so the two cannot share one), else this one where SkyPilot is importable; otherwise the tests skip.
SkyPilot (it keeps its state, logs and catalogs
under ~/.sky). Offline, its optimizer runs on a catalog written there in SkyPilot's own CSV format
(sky/catalog/data_fetchers/fetch_lambda_cloud.py columns; Lambda, whose catalog is one file and whose
cloud needs no SDK), priced from gpuplan's own price table, and on the cloud cache `sky check` would
have filled (global_user_state.set_enabled_clouds). Nothing reaches a cloud.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuplan.clusters.engine import engine_for
from gpuplan.clusters.job import JobError, job_for
from gpuplan.clusters.skypilot import SKYPILOT_ACCELERATORS, TASK_FILE, default_seconds, planned_seconds
from gpuplan.plan.build import plan_file
from gpuplan.spec.buckets import BUCKET_STORES, bucket_problem
from tests.helpers.cluster_launches import BUCKET, IMAGE, MULTI_NODE_SPEC, launch_for
from tests.helpers.planning import ENV

SKYPILOT_PYTHON_ENV = "GPUPLAN_TEST_SKYPILOT_PYTHON"


def skypilot_python() -> tuple[str | None, str]:
    """(the interpreter that runs SkyPilot, or None, and why not)."""
    named = os.environ.get(SKYPILOT_PYTHON_ENV)
    if named:
        if not os.access(named, os.X_OK):
            return None, f"{SKYPILOT_PYTHON_ENV}={named} is not an executable interpreter"
        return named, ""
    if importlib.util.find_spec("sky") is not None:
        return sys.executable, ""
    return None, (
        f"SkyPilot is not installed here and {SKYPILOT_PYTHON_ENV} names no interpreter that has it "
        "(python3 -m venv V && V/bin/pip install 'skypilot>=0.14,<0.15'; .ci/run does)"
    )


SKY_PYTHON, NO_SKY = skypilot_python()
# imported only in subprocesses whose HOME is tmp_path: importing sky writes ~/.sky
needs_skypilot = pytest.mark.skipif(SKY_PYTHON is None, reason=NO_SKY)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan():
    return plan_file(MULTI_NODE_SPEC, environment=ENV)


def sky_job(plan, **changes):
    return job_for(plan, launch_for(plan, "skypilot", **changes), environment=ENV, prices={}, calibrations=[])


def sky_python(tmp_path: Path, code: str, *args: str) -> dict:
    """Run `code` with SkyPilot imported under HOME = tmp_path (SKY_PYTHON); its last stdout line, as JSON."""
    assert SKY_PYTHON is not None
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    proc = subprocess.run([SKY_PYTHON, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOAD = """
import json, sys
import sky
from sky.data.storage import Storage, StorageMode
task = sky.Task.from_yaml(sys.argv[1])

def verdict(url):  # what SkyPilot's API server checks of a mounted source (Storage.construct -> _validate_source)
    try:
        Storage._validate_source(url, StorageMode.MOUNT_CACHED, False)
        return "ok"
    except Exception as e:
        return type(e).__name__

print(json.dumps({
    "num_nodes": task.num_nodes,
    "resources": [{"accelerators": r.accelerators, "use_spot": r.use_spot, "image_id": r.image_id[None] if r.image_id else None,
                   "cpus": r.cpus, "memory": r.memory, "job_recovery": r.job_recovery} for r in task.resources],
    "envs": dict(task.envs), "run": task.run, "name": task.name,
    "storage_mounts": {p: {"source": m.source, "mode": m.mode.value} for p, m in task.storage_mounts.items()},
    "file_mounts": task.file_mounts,
    "sources": {url: verdict(url) for url in json.loads(sys.argv[2])},
}))
"""
# buckets gpuplan takes (one per scheme of spec/buckets.py) and one it refuses, as SkyPilot's own check judges them
ACCEPTED = ["https://myaccount.blob.core.windows.net/ckpt" if s == "https" else f"{s}://my-bucket" for s in BUCKET_STORES]
FOLDER = "s3://my-bucket/runs"


@needs_skypilot
@pytest.mark.slow  # importing SkyPilot takes seconds
def test_the_task_loads_with_skypilots_own_from_yaml(plan, tmp_path):
    job = sky_job(plan)
    path = tmp_path / TASK_FILE
    path.write_text(engine_for("skypilot").render(job)[TASK_FILE])
    got = sky_python(tmp_path, LOAD, str(path), json.dumps([*ACCEPTED, FOLDER]))
    assert got["num_nodes"] == job.nodes == 2 and got["name"] == job.name
    # the bucket the plan chose, mounted with write-back at launch.storage, where output.dir is
    assert got["storage_mounts"] == {job.storage: {"source": BUCKET, "mode": "MOUNT_CACHED"}} and not got["file_mounts"]
    assert job.output_dir.startswith(job.storage + "/")
    assert {u: got["sources"][u] for u in ACCEPTED} == dict.fromkeys(ACCEPTED, "ok")
    assert got["sources"][FOLDER] == "StorageModeError" and bucket_problem(FOLDER) is not None  # refused by both
    # one Resources per GPU type that fits 2 x 8 (clusters/accelerators.py), each with the plan's 8 per node
    assert len(job.resources.accelerators) > 10 and "H100-80GB" in job.resources.accelerators
    listed = sorted(item for r in got["resources"] for item in r["accelerators"].items())
    assert listed == sorted((SKYPILOT_ACCELERATORS[g], 8) for g in job.resources.accelerators)
    for r in got["resources"]:
        assert r["use_spot"] is True and r["image_id"] == f"docker:{IMAGE}"
        assert r["cpus"] == f"{job.resources.cpus_per_node}+"
        assert r["job_recovery"] == {"strategy": "FAILOVER", "max_restarts_on_errors": 3}
    assert got["envs"]["GPUPLAN_JOB_ID"] == f"skypilot:{job.name}" and got["envs"]["MASTER_PORT"] == str(job.master_port)
    assert shlex.join(job.command) in got["run"] and "$SKYPILOT_NODE_RANK" in got["run"]


PROBE = "import os, sys; print(os.environ['MASTER_ADDR'], *sys.argv[1:])"


def test_each_node_runs_the_saved_plan_with_skypilots_rank_and_node_0_as_host(plan, tmp_path):
    job = sky_job(plan, gpuplan_command=shlex.join([sys.executable, "-c", PROBE]))
    run = yaml.safe_load(engine_for("skypilot").render(job)[TASK_FILE])["run"]
    env = {
        "PATH": os.environ["PATH"],
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8",
        "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    }
    out = subprocess.run(["/bin/sh", "-c", run], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["10.0.0.7", "apply", job.plan_file, "--yes", "--in-job", "--node-rank", "1"]
    wrong = subprocess.run(["/bin/sh", "-c", run], env={**env, "SKYPILOT_NUM_GPUS_PER_NODE": "4"}, capture_output=True, text=True)
    assert wrong.returncode == 1 and "the plan needs 8 GPUs per node, SkyPilot gave 4" in wrong.stderr


# The optimizer, offline: one Lambda region with an 8-GPU instance type of every listed GPU gpuplan has a price for.
OPTIMIZE = """
import json, sys
import sky
from sky import check, global_user_state, skypilot_config
from sky.clouds import cloud as sky_cloud
from gpuplan.clusters.skypilot import load_task, narrowed, optimize

ws = skypilot_config.get_active_workspace()
global_user_state.set_enabled_clouds(["Lambda"], sky_cloud.CloudCapability.COMPUTE, ws)  # what `sky check` caches
global_user_state.set_allowed_clouds(check._get_workspace_allowed_clouds(ws), ws)
seconds, default_s, priced = json.loads(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
out = {}
for with_time in (False, True):
    task = load_task(sys.argv[1], seconds, default_s)
    if not with_time:
        task.time_estimator_func = None  # the YAML alone: SkyPilot's one-hour default
    best = optimize(task, quiet=True)
    run_s = task.estimate_runtime(best) if with_time else 3600
    out["with_time" if with_time else "hourly"] = {"accelerators": best.accelerators, "cost": best.get_cost(run_s) * task.num_nodes}
    if with_time:
        out["estimates"] = {a: task.estimate_runtime(sky.Resources(accelerators={a: 8})) for a in priced}
        out["narrowed"] = [r.accelerators for r in narrowed(task, best).resources]
print(json.dumps(out))
"""


def lambda_catalog(home: Path, rows: dict[str, float]) -> None:
    """SkyPilot's catalog files (schema v8, sky/skylet/constants.py CATALOG_SCHEMA_VERSION) for Lambda; prices per instance-hour."""
    root = home / ".sky" / "catalogs" / "v8"
    (root / "lambda").mkdir(parents=True)
    (root / "common").mkdir(parents=True)
    lines = ["InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region,GpuInfo,SpotPrice"]
    lines += [f"gpu_8x_{acc.lower()},{acc},8.0,208.0,1800.0,{price:.4f},us-east-1,," for acc, price in rows.items()]
    (root / "lambda" / "vms.csv").write_text("\n".join(lines) + "\n")
    (root / "common" / "accelerators.csv").write_text("AcceleratorName,Clouds\n" + "".join(f"{a},\"['Lambda']\"\n" for a in rows))
    (root / "common" / "metadata.csv").write_text("GPU,MemoryGB,Manufacturer\n" + "".join(f"{a},80,NVIDIA\n" for a in rows))


@needs_skypilot
@pytest.mark.slow
def test_the_planned_time_reaches_skypilots_optimizer_so_it_ranks_by_total_cost(plan, tmp_path):
    from gpuplan.plan.compare import compare_row
    from gpuplan.spec.load import load_toml

    job = sky_job(plan, spot=False)  # Lambda has no spot instances
    # two of the GPU types the job lists, priced and timed by gpuplan's compare (plan/compare.py) at 2 nodes x 8; the
    # catalog below has instances of these two only, so SkyPilot finds none of the others
    loaded = load_toml(MULTI_NODE_SPEC)
    rows = {g: compare_row(loaded, g, 16, environment=ENV, prices={}, calibrations=[]) for g in ("H100-80GB", "A100-80GB")}
    assert all(r["fits"] and r["run_time_s"] and r["price_per_gpu_hour"] for r in rows.values())
    assert set(rows) < set(job.resources.accelerators)
    hourly = {g: r["price_per_gpu_hour"] * 8 for g, r in rows.items()}
    total = {g: r["cost_usd"] for g, r in rows.items()}
    cheapest_hour, cheapest_run = min(hourly, key=hourly.__getitem__), min(total, key=total.__getitem__)
    # the point of the hand-off: per hour the A100s are cheaper, for the whole run the H100s are
    assert (cheapest_hour, cheapest_run) == ("A100-80GB", "H100-80GB")
    order = job.resources.accelerators
    assert order.index(cheapest_run) < order.index(cheapest_hour)  # compare's order: the cheaper run first

    path = tmp_path / TASK_FILE
    path.write_text(engine_for("skypilot").render(job)[TASK_FILE])
    lambda_catalog(tmp_path, {SKYPILOT_ACCELERATORS[g]: p for g, p in hourly.items()})
    priced = [SKYPILOT_ACCELERATORS[g] for g in rows]
    got = sky_python(tmp_path, OPTIMIZE, str(path), json.dumps(planned_seconds(job)), str(default_seconds(job)), json.dumps(priced))

    # without the time, SkyPilot prices one hour and takes the cheaper hour
    assert got["hourly"]["accelerators"] == {SKYPILOT_ACCELERATORS[cheapest_hour]: 8}
    assert got["hourly"]["cost"] == pytest.approx(2 * hourly[cheapest_hour])
    # with it, each GPU type's estimate is its own planned run time and the cost is the run's: the cheapest run wins
    assert got["estimates"] == {SKYPILOT_ACCELERATORS[g]: round(r["run_time_s"]) for g, r in rows.items()}
    w = got["with_time"]
    assert w["accelerators"] == {SKYPILOT_ACCELERATORS[cheapest_run]: 8}
    assert w["cost"] == pytest.approx(total[cheapest_run], rel=1e-3)
    assert got["narrowed"] == [{SKYPILOT_ACCELERATORS[cheapest_run]: 8}]  # what submit() launches


def test_a_gpu_skypilot_cannot_name_is_refused(plan):
    job = sky_job(plan)
    job = dataclasses.replace(job, resources=dataclasses.replace(job.resources, gpu="H100-PCIe", accelerators=("H100-PCIe",)))
    with pytest.raises(JobError, match="'H100-PCIe' has no SkyPilot accelerator name") as e:
        engine_for("skypilot").render(job)
    assert e.value.diagnostics[0].key == "hardware.gpu"


STATUS = """
import json
from sky.jobs.state import ManagedJobStatus
from sky.schemas.api.responses import ManagedJobRecord
from gpuplan.clusters.skypilot import managed_job_status

records = [
    ManagedJobRecord(job_id=6, status=ManagedJobStatus.RECOVERING),
    {"job_id": 7, "status": "FAILED", "failure_reason": "out of memory"},
]
print(json.dumps({i: managed_job_status(records, i, "sky jobs queue").to_dict() for i in ("6", "7", "8")}))
"""


@needs_skypilot
@pytest.mark.slow  # importing SkyPilot takes seconds
def test_the_status_of_a_managed_job_from_skypilots_own_records(tmp_path):
    got = sky_python(tmp_path, STATUS)
    assert (got["6"]["state"], got["6"]["done"]) == ("RECOVERING", False)
    assert (got["7"]["state"], got["7"]["done"], got["7"]["detail"]) == ("FAILED", True, "out of memory")
    assert got["8"]["state"] == "not found"
