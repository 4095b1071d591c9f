"""`gpuplan plan` / `gpuplan apply [--dry-run]` with launch.target = kubernetes, skypilot or ray, as a user runs them.

A missing client is refused before anything is written, naming the binary or the package and the dry
run; --dry-run writes the job dir with the engine's rendered file beside the saved plan. The hand-off
is torch-free, so the commands run in this process (gpuplan.cli.main), their output captured.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.cluster_launches import cluster_spec, in_process

LAUNCH = {
    "kubernetes": 'image = "ghcr.io/example/gpuplan:0.1"\nnamespace = "ml"\nqueue = "team-a"\nstorage_claim = "shared-pvc"\n',
    "skypilot": 'image = "ghcr.io/example/gpuplan:0.1"\nstorage_bucket = "s3://my-bucket"\n',
    "ray": "",
}
RENDERED = {"kubernetes": "trainjob.yaml", "skypilot": "sky-task.yaml", "ray": "ray_job.py"}


def spec(tmp_path: Path, target: str) -> Path:
    return cluster_spec(tmp_path, f'target = "{target}"\n{LAUNCH[target]}', name=target)


gpuplan = in_process


def test_plan_shows_the_job_it_would_submit(tmp_path, capsys):
    code, out, err = gpuplan(capsys, "plan", spec(tmp_path, "kubernetes"), "--no-color")
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("Job (kubernetes): ")]
    assert "2 nodes x 8" in line and "H100-80GB" in line and "(16 ranks)" in line
    assert "kubernetes: image ghcr.io/example/gpuplan:0.1, namespace ml, queue team-a" in out


@pytest.mark.parametrize("target, client", [("kubernetes", "kubectl"), ("ray", "ray[default]")])
def test_a_missing_client_is_named_with_the_dry_run_as_the_way_out(tmp_path, capsys, monkeypatch, target, client):
    path = spec(tmp_path, target)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # kubectl is not on this PATH
    # nor can Ray's job client be imported (a None in sys.modules is how Python marks a module absent:
    # importlib.util.find_spec returns None for it), as where gpuplan was installed without the cluster-ray extra
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, err = gpuplan(capsys, "apply", path, "--yes")
    assert code == 1 and "Traceback" not in err
    assert client in err and f"gpuplan apply {path} --dry-run" in err
    assert not (tmp_path / "shared").exists()  # nothing written


@pytest.mark.parametrize("target", ["kubernetes", "skypilot", "ray"])
def test_dry_run_writes_the_rendered_job_beside_the_saved_plan(tmp_path, capsys, target):
    code, out, err = gpuplan(capsys, "apply", spec(tmp_path, target), "--dry-run")
    assert code == 0, err
    job_dir = tmp_path / "shared" / "runs" / "llama" / "gpuplan-job"
    assert (job_dir / "plan.json").is_file() and (job_dir / f"{target}.toml").is_file()
    text = (job_dir / RENDERED[target]).read_text()
    assert str(job_dir / "plan.json") in text
    if target != "ray":
        assert yaml.safe_load(text)
    assert f"Wrote the {target} job without submitting it" in out
    assert not (tmp_path / "shared" / "runs" / "llama" / "gpuplan-state.json").exists()  # nothing submitted, nothing recorded


@pytest.mark.parametrize("address", ["ray-head:8265", "ftp://ray-head:8265", "http://ray-head:82a5"])
def test_a_ray_dashboard_address_that_is_not_an_http_url_is_refused_with_the_form_to_write(tmp_path, capsys, address):
    # Ray's job client would take "ray-head:8265" for a GCS address and look the dashboard up there
    path = cluster_spec(tmp_path, f'target = "ray"\nray_dashboard_address = "{address}"', name="ray")
    code, _, err = gpuplan(capsys, "plan", path)
    assert code == 1 and "Traceback" not in err
    assert f"launch.ray_dashboard_address: {address!r} is not the Ray dashboard's http:// or https:// address" in err
    assert 'write it as "http://HEAD:8265"' in err
