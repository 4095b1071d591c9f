"""Plan-time checks of the data files and the plan-wide warnings (issue 15: items 2 and 5)."""

import json
import shutil

import pytest

from gpuplan.hardware.detect import cpu_profile
from gpuplan.plan.types import PlanError
from tests.helpers.cli_runs import gpuplan
from tests.helpers.planning import SPECS, plan_text, spec

TINY = dict(model="tiny-llama-cpu", gpu="cpu", training="effective_batch_size = 16\nmax_steps = 5")


def test_a_missing_train_file_is_an_error_naming_the_key_and_the_resolved_path(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec(**TINY, data='seq_len = 128\ntrain_files = ["data/nope.jsonl"]'))
    d = e.value.diagnostics[0]
    assert d.severity == "error" and d.key == "data.train_files[0]"
    assert d.summary == f"data.train_files[0]: {tmp_path / 'data' / 'nope.jsonl'} does not exist"
    assert "relative to the spec's directory" in d.detail


def test_eval_files_empty_files_and_directories_are_checked_too(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "dir").mkdir()
    shutil.copy(SPECS / "data" / "tiny-corpus.txt", tmp_path / "ok.txt")
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec(**TINY, data='seq_len = 128\ntrain_files = ["ok.txt", "empty.txt", "dir"]\neval_files = ["gone.txt"]'))
    summaries = [d.summary for d in e.value.diagnostics if d.severity == "error"]
    assert summaries == [
        f"data.train_files[1]: {tmp_path / 'empty.txt'} is empty",
        f"data.train_files[2]: {tmp_path / 'dir'} is a directory, not a file",
        f"data.eval_files[0]: {tmp_path / 'gone.txt'} does not exist",
    ]


def test_plan_and_validate_exit_1_without_writing_anything(tmp_path):
    out = tmp_path / "run"
    path = tmp_path / "s.toml"
    path.write_text(
        spec(**TINY, data='seq_len = 128\ntrain_files = ["nope.txt"]').replace("@MODELS@", str(SPECS / "models"))
        + f'[output]\ndir = "{out}"\n'
    )
    for cmd in ("plan", "validate"):
        r = gpuplan(cmd, path)
        assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        assert f"Error: data.train_files[0]: {tmp_path / 'nope.txt'} does not exist" in r.stderr
        assert "Traceback" not in r.stderr
    r = gpuplan("apply", path, "--yes")
    assert r.returncode == 1 and "data.train_files[0]" in r.stderr
    assert not out.exists()  # no failed state left behind


def test_shipped_specs_resolve_their_data_relative_to_the_spec_from_any_directory(tmp_path):
    r = gpuplan("plan", SPECS / "llama-70b-8xh100.toml", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["data.train_files"]["value"] == [str(SPECS / "data" / "tiny-corpus.txt")]


def test_auto_resolved_to_cpu_says_so_and_how_to_plan_for_a_gpu(tmp_path):
    plan = plan_text(tmp_path, spec(**{**TINY, "gpu": "auto"}), detect=lambda: cpu_profile()[0])
    warn = [d for d in plan.diagnostics if d.key == "hardware.gpu"]
    assert len(warn) == 1 and warn[0].severity == "warning"
    assert warn[0].summary.startswith('hardware.gpu = "auto" resolved to "cpu"')
    assert "--gpu A100-80GB" in warn[0].fix
    named = plan_text(tmp_path, spec(**TINY))  # gpu = "cpu" asked for: nothing to say
    assert not [d for d in named.diagnostics if d.key == "hardware.gpu"]


def test_a_run_longer_than_a_week_is_a_warning_whose_fix_fits_a_week(tmp_path):
    text = spec(model="llama-3.2-1b", gpu="cpu", data="seq_len = 2048", training="effective_batch_size = 64\nmax_steps = 1000")
    plan = plan_text(tmp_path, text)
    [warn] = [d for d in plan.diagnostics if d.key == "training.max_steps" and d.severity == "warning"]
    assert "more than a week" in warn.summary
    steps = int(warn.fix.split("training.max_steps = ")[1].split()[0])
    fixed = plan_text(tmp_path, text.replace("max_steps = 1000", f"max_steps = {steps}"))
    assert fixed.throughput.run_time_s <= 7 * 24 * 3600
    assert not [d for d in fixed.diagnostics if d.key == "training.max_steps" and d.severity == "warning"]
    gpu = plan_text(tmp_path, text.replace('gpu = "cpu"', 'gpu = "H100-80GB"'))  # the other fix
    assert not [d for d in gpu.diagnostics if "more than a week" in d.summary]


def test_init_without_a_gpu_says_the_spec_plans_for_the_cpu(tmp_path):
    from gpuplan.hardware.detect import detect

    out = tmp_path / "starter.toml"
    r = gpuplan("init", SPECS / "models" / "llama-3.2-1b.json", "--out", out)
    assert r.returncode == 0, r.stderr
    if detect()[0].vendor != "cpu":
        assert "No GPU detected" not in r.stdout
        return
    assert 'No GPU detected on this machine: hardware.gpu = "auto" plans for its CPU here' in r.stdout
    assert f"gpuplan plan {out} --gpu A100-80GB" in r.stdout
    assert gpuplan("plan", out, "--gpu", "A100-80GB").returncode == 0  # the suggested command works
