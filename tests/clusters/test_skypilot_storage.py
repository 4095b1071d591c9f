"""A SkyPilot job's shared storage: launch.storage_bucket mounted at launch.storage (file_mounts, MOUNT_CACHED),
or launch.storage_shared for an image or cloud that already shares it; several nodes with neither are refused
at plan time. `gpuplan plan` runs in this process (torch-free), its output captured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuplan.clusters.skypilot import TASK_FILE
from gpuplan.spec.buckets import BUCKET_STORES, bucket_problem
from tests.helpers.cluster_launches import cluster_spec, in_process


def spec(tmp_path: Path, launch: str, nodes: int = 2) -> Path:
    return cluster_spec(tmp_path, f'target = "skypilot"\nimage = "ghcr.io/example/gpuplan:0.1"\n{launch}', name="sky", nodes=nodes)


gpuplan = in_process


def test_plan_shows_the_bucket_mounted_at_launch_storage_and_the_dry_run_renders_it(tmp_path, capsys):
    path = spec(tmp_path, 'storage_bucket = "s3://my-bucket"')
    code, out, err = gpuplan(capsys, "plan", path, "--no-color")
    assert code == 0, err
    shared = tmp_path / "shared"
    assert f"  storage: SkyPilot mounts s3://my-bucket at {shared} on every node (MOUNT_CACHED: " in out
    assert f"mount the bucket at {shared} on this machine too" in out
    assert "skypilot: image ghcr.io/example/gpuplan:0.1, storage_bucket s3://my-bucket" in out
    code, out, err = gpuplan(capsys, "plan", path, "--json")
    assert code == 0, err
    assert json.loads(out)["job"]["storage_mount"] == {"path": str(shared), "source": "s3://my-bucket", "mode": "MOUNT_CACHED"}

    code, out, err = gpuplan(capsys, "apply", path, "--dry-run")
    assert code == 0, err
    task = yaml.safe_load((shared / "runs" / "llama" / "gpuplan-job" / TASK_FILE).read_text())
    assert task["file_mounts"] == {str(shared): {"source": "s3://my-bucket", "mode": "MOUNT_CACHED"}}


def test_several_nodes_without_a_bucket_or_a_shared_mount_are_refused_at_plan_time(tmp_path, capsys):
    code, out, err = gpuplan(capsys, "plan", spec(tmp_path, ""), "--no-color")
    assert code == 1 and "Traceback" not in err
    assert "launch.storage_bucket" in err and "hardware.nodes = 2 on SkyPilot" in err
    assert "the VMs SkyPilot provisions have no shared file system" in err
    assert 'set launch.storage_bucket to a bucket SkyPilot mounts at launch.storage on every node ("s3://my-bucket")' in err
    # the fix, followed, plans
    fixed = spec(tmp_path, 'storage_bucket = "s3://my-bucket"')
    assert gpuplan(capsys, "plan", fixed)[0] == 0


def test_storage_shared_mounts_nothing(tmp_path, capsys):
    path = spec(tmp_path, "storage_shared = true")
    code, out, err = gpuplan(capsys, "plan", path, "--no-color")
    assert code == 0, err
    assert f"  storage: {tmp_path / 'shared'} is a shared file system the nodes already mount (launch.storage_shared)" in out
    assert gpuplan(capsys, "apply", path, "--dry-run")[0] == 0
    task = yaml.safe_load((tmp_path / "shared" / "runs" / "llama" / "gpuplan-job" / TASK_FILE).read_text())
    assert "file_mounts" not in task


def test_one_node_without_a_bucket_is_told_a_relaunch_starts_over(tmp_path, capsys):
    code, out, err = gpuplan(capsys, "plan", spec(tmp_path, "", nodes=1), "--no-color")
    assert code == 0, err
    assert "is on the VM's own disk: a job SkyPilot relaunches on a new VM starts from step 0" in out


@pytest.mark.parametrize(
    "launch, message",
    [
        ('storage_bucket = "s3://my-bucket/runs"', "SkyPilot mounts only a whole bucket (its MOUNT modes refuse a folder"),
        ('storage_bucket = "ftp://my-bucket"', "it is not a bucket URL SkyPilot mounts (supported: s3://, gs://"),
        ('storage_bucket = "/data/bucket"', "it is not a bucket URL SkyPilot mounts"),
        ('storage_bucket = "cos://us-east/my-bucket"', "IBM COS has no MOUNT_CACHED mount in SkyPilot 0.14"),
        ('storage_bucket = "hf://buckets/me/b"', "without rclone's write-back"),
        ('storage_bucket = "https://example.com/c"', "an https:// bucket is an Azure container"),
        ('storage_bucket = "s3://my-bucket"\nstorage_shared = true', "both say what launch.storage is"),
    ],
)
def test_a_bucket_skypilot_cannot_mount_for_checkpoints_is_refused_with_the_key_and_the_fix(tmp_path, capsys, launch, message):
    code, out, err = gpuplan(capsys, "plan", spec(tmp_path, launch))
    assert code == 1 and "Traceback" not in err and out == ""
    assert "launch.storage_bucket" in err and message in err, err
    assert not (tmp_path / "shared").exists()


def test_a_folder_in_the_bucket_goes_into_output_dir_and_the_fix_names_the_bucket():
    why, fix = bucket_problem("gs://my-bucket/runs/a")
    assert "names a folder in a bucket" in why
    assert fix == 'set launch.storage_bucket = "gs://my-bucket" and put the folder in output.dir (under launch.storage)'
    azure = bucket_problem("https://myaccount.blob.core.windows.net/ckpt/x")
    assert azure is not None and 'launch.storage_bucket = "https://myaccount.blob.core.windows.net/ckpt" and' in azure[1]
    for scheme in BUCKET_STORES:
        url = "https://myaccount.blob.core.windows.net/ckpt" if scheme == "https" else f"{scheme}://my-bucket"
        assert bucket_problem(url) is None and bucket_problem(url + "/") is None


def test_a_bucket_needs_its_mount_path_and_is_for_skypilot_only(tmp_path, capsys):
    path = spec(tmp_path, 'storage_bucket = "s3://my-bucket"')
    path.write_text(path.read_text().replace(f'storage = "{tmp_path / "shared"}"\n', ""))
    code, _, err = gpuplan(capsys, "plan", path)
    assert code == 1 and "has no mount path: set launch.storage to where the bucket is mounted" in err
    slurm = spec(tmp_path, 'storage_bucket = "s3://my-bucket"')
    slurm.write_text(
        slurm.read_text().replace('target = "skypilot"', 'target = "slurm"').replace('image = "ghcr.io/example/gpuplan:0.1"\n', "")
    )
    code, _, err = gpuplan(capsys, "plan", slurm)
    assert code == 1 and 'launch.storage_bucket is for launch.target = "skypilot", not "slurm"' in err


def test_on_a_bucket_a_missing_file_is_an_unfinished_upload_and_an_unreadable_marker_still_stops(tmp_path):
    """find_resumable on real checkpoint dirs (marker written by write_marker): what a cut upload leaves is set
    aside on a bucket; a marker that does not parse is no upload's doing (an object lands whole), so it still stops."""
    from gpuplan.apply.train.checkpoints import MARKER, find_resumable, write_marker

    for step in (2, 4, 6):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"w" * 64)
        (d / "trainer_state.json").write_text("{}")
        write_marker(str(d), step)
    (tmp_path / "checkpoint-6" / "model.safetensors").unlink()  # never uploaded
    assert find_resumable(str(tmp_path), on_bucket=True) == (str(tmp_path / "checkpoint-4"), [str(tmp_path / "checkpoint-6")], [])
    assert find_resumable(str(tmp_path))[2] == [(str(tmp_path / "checkpoint-6"), "corrupt: model.safetensors is missing")]
    (tmp_path / "checkpoint-4" / MARKER).write_text("{not json")
    ckpt, incomplete, corrupt = find_resumable(str(tmp_path), on_bucket=True)
    assert ckpt == str(tmp_path / "checkpoint-2") and incomplete == [str(tmp_path / "checkpoint-6")]
    assert [d for d, _ in corrupt] == [str(tmp_path / "checkpoint-4")]  # refused by the apply (session.latest_checkpoint)


@pytest.mark.parametrize("bucket", [True, False])
def test_a_relaunch_whose_state_never_reached_the_bucket_resumes_from_its_checkpoint(tmp_path, bucket):
    """rclone uploads a file once it stops changing: the state (rewritten every step) can miss the bucket while a
    checkpoint made it. On a bucket the run resumes from that checkpoint; elsewhere no state is a new run."""
    from gpuplan.apply.launch.session import resume_point
    from gpuplan.apply.train.checkpoints import write_marker
    from gpuplan.plan.build import plan_file
    from tests.helpers.cli_runs import tiny_spec
    from tests.helpers.planning import ENV

    mount = tmp_path / "bucket"
    out = mount / "runs" / "tiny"
    path = tiny_spec(tmp_path / "tiny.toml", out)
    launch = f'storage = "{mount}"\nimage = "ghcr.io/example/gpuplan:0.1"\n' + ('storage_bucket = "s3://my-bucket"\n' if bucket else "")
    path.write_text(path.read_text() + '\n[launch]\ntarget = "skypilot"\n' + launch)
    ckpt = out / "checkpoint-2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    write_marker(str(ckpt), 2)
    got = resume_point(plan_file(path, environment=ENV), restart=False)
    if bucket:
        assert got == (str(ckpt), f"resuming from {ckpt}: the run's gpuplan-state.json had not reached the bucket when its VM stopped")
    else:
        assert got == (None, "new run")
