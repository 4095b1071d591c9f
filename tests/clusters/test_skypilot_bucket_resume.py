"""A SkyPilot job's run on its bucket (launch.storage_bucket, MOUNT_CACHED write-back), on the real CLI and Trainer.

The job's own command runs here as it runs on a node: `gpuplan apply JOB_DIR/plan.json --yes --in-job`
of the plan that `gpuplan apply SPEC --dry-run` wrote, with the GPUPLAN_JOB_ID the task sets, on a
folder standing for the bucket's mount. The VM dies (SIGKILL) after a few saves, and its last complete
checkpoint is cut short on disk, as an upload that never finished leaves it: the relaunched job's
apply sets it aside, says so, and resumes from the checkpoint before it, at its step.

Then the same on a real write-back mount: rclone (Debian's rclone and fuse3; .ci/run installs them, the test
skips without them) mounts a local folder standing for the bucket with SkyPilot's MOUNT_CACHED flags; the VM
dies with rclone and its cache, and a fresh mount resumes the run from what reached the bucket.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpuplan.apply.train.checkpoints import checkpoint_dirs, checkpoint_problem, find_resumable
from gpuplan.lifecycle.run_lock import JOB_ID_ENV
from tests.helpers.cli_runs import gpuplan, start, state, tiny_spec, train_steps

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

JOB_ID = "skypilot:tiny-bucket"


def bucket_spec(tmp_path: Path, max_steps: int = 12, save_steps: int = 2) -> tuple[Path, Path]:
    """(spec, output.dir): the tiny CPU run as a one-node SkyPilot job whose launch.storage is a bucket mount."""
    mount = tmp_path / "bucket"
    out = mount / "runs" / "tiny"
    spec = tiny_spec(tmp_path / "tiny.toml", out, max_steps=max_steps, save_steps=save_steps, keep=3)
    spec.write_text(
        spec.read_text()
        + f'\n[launch]\ntarget = "skypilot"\nimage = "ghcr.io/example/gpuplan:0.1"\nstorage = "{mount}"\nstorage_bucket = "s3://my-bucket"\n'
    )
    return spec, out


def _complete(out: Path) -> list[int]:
    try:
        return [step for step, d in checkpoint_dirs(str(out)) if checkpoint_problem(d) is None]
    except OSError:  # rotated away while we looked
        return []


def _wait_for(predicate, proc, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"apply ended early (rc {proc.returncode}): {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.02)


def test_a_checkpoint_the_dead_vm_did_not_finish_uploading_is_set_aside_and_the_run_resumes_from_the_one_before(tmp_path):
    spec, out = bucket_spec(tmp_path)
    r = gpuplan("apply", spec, "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    plan_json = out / "gpuplan-job" / "plan.json"
    assert "file_mounts" in (out / "gpuplan-job" / "sky-task.yaml").read_text()

    job = ("apply", plan_json, "--yes", "--in-job", "--node-rank", "0")
    proc = start(*job, **{JOB_ID_ENV: JOB_ID})
    _wait_for(lambda: len(_complete(out)) >= 2, proc)
    time.sleep(random.uniform(0.0, 0.2))
    assert proc.poll() is None, "the run finished before the VM was killed"
    proc.kill()  # the VM is gone: no handler, no cleanup
    proc.wait()
    assert state(out)["status"] == "running"

    last, before = _complete(out)[:2]
    weights = out / f"checkpoint-{last}" / "model.safetensors"
    full = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: full // 3])  # the upload of the weights never finished
    cut = f"corrupt: model.safetensors is {full // 3} bytes, {full} when saved"
    assert checkpoint_problem(str(weights.parent)) == cut
    # on a disk this is a checkpoint whose files changed (a person decides); on the bucket, an unfinished upload
    assert find_resumable(str(out))[2] == [(str(weights.parent), cut)]
    assert find_resumable(str(out), on_bucket=True)[0] == str(out / f"checkpoint-{before}")

    r = gpuplan(*job, **{JOB_ID_ENV: JOB_ID})  # the relaunched job on a new VM: same job id, takes its own lock over
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout + r.stderr
    assert f"Set aside {weights.parent} ({cut}): the last apply did not finish saving or uploading it" in said
    assert f"resuming the running run from {out / f'checkpoint-{before}'}" in said
    s = state(out)
    assert s["status"] == "completed" and s["resumed_from"] == str(out / f"checkpoint-{before}")
    assert s["progress"]["global_step"] == 12
    assert train_steps(out) == list(range(1, 13))  # resumed at step `before`: no step lost, none logged twice
    (moved,) = [p for p in out.glob(f"incomplete-checkpoint-{last}-*") if p.is_dir()]
    assert (moved / "model.safetensors").stat().st_size == full // 3  # set aside, never deleted
    assert all(checkpoint_problem(d) is None for _, d in checkpoint_dirs(str(out)))


# SkyPilot's MOUNT_CACHED mount, as its nodes run it (sky/data/mounting_utils.py get_mount_cached_cmd), without
# --daemon (the test holds the process) and on rclone's local backend: a folder stands for the bucket. The
# write-back delay is 1 s instead of rclone's 5 s (SkyPilot's config.mount_cached.vfs_write_back sets it), so a
# checkpoint reaches the bucket while the tiny run is still training, however fast this machine runs it.
RCLONE_FLAGS = [
    *("--vfs-cache-mode", "full", "--dir-cache-time", "10s", "--vfs-cache-poll-interval", "10s", "--vfs-fast-fingerprint"),
    *("--vfs-write-back", "1s"),
]


def _rclone_missing() -> str | None:
    missing = [b for b in ("rclone", "fusermount3") if shutil.which(b) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install -y rclone fuse3)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse here"
    return None


def _mounted(path: Path) -> bool:
    with open("/proc/mounts", encoding="utf-8") as f:
        return any(line.split()[1] == str(path) for line in f)


class Mount:
    """`rclone mount` of `bucket` at `path` with a VFS cache of its own (one VM's disk)."""

    def __init__(self, bucket: Path, path: Path, cache: Path):
        self.path = path
        env = {**os.environ, "RCLONE_CONFIG": str(cache.parent / "rclone.conf")}  # no ~/.config/rclone
        log = cache.parent / f"{cache.name}.log"
        args = ["rclone", "mount", f":local:{bucket}", str(path), *RCLONE_FLAGS, "--cache-dir", str(cache), "--log-file", str(log)]
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not _mounted(path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                pytest.skip(f"rclone cannot mount here: {log.read_text()[-500:] if log.is_file() else 'no log'}")
            time.sleep(0.1)

    def die(self) -> None:
        """The VM is gone: rclone killed with what it had not uploaded, the dead mount detached."""
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["fusermount3", "-uz", str(self.path)], check=False, capture_output=True)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # rclone uploads what is pending, then unmounts
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        subprocess.run(["fusermount3", "-uz", str(self.path)], check=False, capture_output=True)


def _uploaded_state_is(run: Path, status: str) -> bool:
    try:  # rclone's local backend may be writing the file as we read it
        return state(run)["status"] == status
    except (OSError, ValueError):
        return False


STEPS = 64  # the run is stopped (SIGSTOP) once a save is complete, until rclone has uploaded it


@pytest.mark.skipif(_rclone_missing() is not None, reason=str(_rclone_missing()))
def test_on_a_real_write_back_mount_a_job_killed_with_its_vm_resumes_on_a_fresh_one(tmp_path):
    """The job's command on rclone's MOUNT_CACHED mount: the VM dies (apply and rclone killed, its cache lost with
    it, uploads cut wherever they were); a fresh mount on a new cache (the relaunched VM) resumes from a complete
    checkpoint, and what the bucket holds at the end is the whole run."""
    spec, out = bucket_spec(tmp_path, max_steps=STEPS, save_steps=4)
    mount_path, bucket = tmp_path / "bucket", tmp_path / "store"
    run = bucket / "runs" / "tiny"  # what the bucket itself holds, uploaded
    mount_path.mkdir()
    bucket.mkdir()
    first = Mount(bucket, mount_path, tmp_path / "vm1-cache")
    try:
        r = gpuplan("apply", spec, "--dry-run")  # the job dir, written into the bucket through the mount
        assert r.returncode == 0, r.stderr[-2000:]
        job = ("apply", out / "gpuplan-job" / "plan.json", "--yes", "--in-job", "--node-rank", "0")
        proc = start(*job, **{JOB_ID_ENV: JOB_ID})
        _wait_for(lambda: len(_complete(out)) >= 1, proc)  # a save is complete on the VM's side of the mount
        # the run holds still (a quiet machine trains the whole tiny run faster than rclone's first upload):
        # once its write-back has uploaded that save, the VM dies with whatever else was still in flight
        os.kill(proc.pid, signal.SIGSTOP)
        _wait_for(lambda: len(_complete(run)) >= 1, proc)  # rclone's write-back uploaded a save
        proc.kill()
        first.die()
        proc.wait()
    finally:
        first.close()
    uploaded = _complete(run)  # what the relaunched VM finds: complete checkpoints, newest first
    assert uploaded, "no checkpoint reached the bucket before the VM died"
    second = Mount(bucket, mount_path, tmp_path / "vm2-cache")
    try:
        r = gpuplan(*job, **{JOB_ID_ENV: JOB_ID})
        assert r.returncode == 0, r.stderr[-3000:]
        s = state(out)
        assert s["status"] == "completed" and s["progress"]["global_step"] == STEPS
        assert s["resumed_from"] == str(out / f"checkpoint-{uploaded[0]}"), r.stdout[-3000:]
        assert train_steps(out) == list(range(1, STEPS + 1)), r.stdout[-3000:]  # no step lost or logged twice
        deadline = time.monotonic() + 60  # the last writes reach the bucket once they stop changing (write-back)
        while not _uploaded_state_is(run, "completed"):
            assert time.monotonic() < deadline, "the finished run's state never reached the bucket"
            time.sleep(0.5)
        time.sleep(3)  # and the last checkpoint's files with it
    finally:
        second.close()
    # the bucket alone (no mount, no cache): the run's state, its metrics and complete checkpoints
    assert state(run)["status"] == "completed" and train_steps(run) == list(range(1, STEPS + 1))
    assert [step for step, d in checkpoint_dirs(str(run)) if checkpoint_problem(d) is None][:1] == [STEPS]
