"""The gpuplan command as a user runs it: a real subprocess, exit codes, stderr, no traceback."""

import json
import subprocess
import sys

import pytest

from tests.helpers.cli_runs import run
from tests.helpers.planning import MODELS, SPECS, write_spec


def gpuplan(*args, cwd=None):
    return run([sys.executable, "-m", "gpuplan.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_plan_text_shows_changes_memory_and_summary():
    r = gpuplan("plan", SPECS / "a100-fp16.toml", "--no-color")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "  ~ training.per_device_train_batch_size = 36 -> 40" in out
    assert "  + training.gradient_accumulation_steps = 9" in out
    assert "allocated peak" in out and "device total" in out and "fits in" in out
    assert any(line.startswith("Plan: ") and "to add, 1 to change." in line for line in out.splitlines())
    assert "\033[" not in out  # no colour when not a terminal


def test_plan_strict_refuses_with_exit_1():
    r = gpuplan("plan", SPECS / "a100-fp16.toml", "--strict")
    assert r.returncode == 1
    assert "(--strict)" in r.stderr and "Traceback" not in r.stderr


def test_plan_json_contract_and_out_file(tmp_path):
    out = tmp_path / "run.plan.json"
    r = gpuplan("plan", SPECS / "a100-fp16.toml", "--json", "--out", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for field in ("format_version", "spec_path", "spec_sha256", "hardware", "settings", "changes", "diagnostics", "memory", "throughput"):
        assert field in data
    assert data["format_version"] == 1
    assert set(data["memory"]) >= {"allocated_peak_bytes", "reserved_peak_bytes", "capacity_bytes", "fits", "components"}
    s = data["settings"]["training.per_device_train_batch_size"]
    assert s == {"value": 40, "source": "adjusted", "reason": s["reason"], "rule": "batch.tensor_core_multiple"}
    assert {"action", "key", "before", "after", "rule", "reason"} == set(data["changes"][0])
    assert "since_last_apply" in data  # stdout adds the drift; the saved plan is the plan alone
    assert json.loads(out.read_text()) == {k: v for k, v in data.items() if k != "since_last_apply"}
    assert data["throughput"]["tokens_per_step"] == 360 * 1000


def test_misspelled_key_exits_1_with_suggestion_and_no_traceback(tmp_path):
    p = write_spec(tmp_path, f'[model]\nconfig = "{MODELS}/gpt2.json"\n[training]\nper_device_batch_size = 4\n')
    r = gpuplan("plan", p)
    assert r.returncode == 1
    assert "did you mean per_device_train_batch_size" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_v100_bf16_and_both_precisions(tmp_path):
    base = (SPECS / "bert-large-v100.toml").read_text().replace('"models/', f'"{MODELS}/').replace('"data/', f'"{SPECS}/data/')
    r = gpuplan("plan", write_spec(tmp_path, base.replace("fp16 = true", "bf16 = true"), "a.toml"), "--no-color")
    assert r.returncode == 0, r.stderr
    assert "~ training.bf16 = true -> false" in r.stdout and "V100-16GB has no bf16" in r.stdout
    assert "+ training.fp16 = true" in r.stdout
    r = gpuplan("plan", write_spec(tmp_path, base.replace("fp16 = true", "fp16 = true\nbf16 = true"), "b.toml"))
    assert r.returncode == 1 and "training.fp16 and training.bf16 are both true" in r.stderr


def test_toml_error_and_directory_and_missing(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    r = gpuplan("plan", bad)
    assert r.returncode == 1 and f"{bad}:1:" in r.stderr and "Traceback" not in r.stderr
    r = gpuplan("plan", tmp_path)
    assert r.returncode == 1 and "is a directory" in r.stderr
    r = gpuplan("plan", tmp_path / "none.toml")
    assert r.returncode == 1 and "no such file" in r.stderr


def test_gpu_flag_overrides_the_spec():
    r = gpuplan("plan", SPECS / "a100-fp16.toml", "--gpu", "h100", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hardware"]["name"] == "H100-80GB"


def test_validate_schema_and_gpus(tmp_path):
    r = gpuplan("validate", SPECS / "tiny.toml")
    assert r.returncode == 0 and "valid" in r.stdout
    r = gpuplan("schema")
    schema = json.loads(r.stdout)
    assert schema["additionalProperties"] is False
    assert "per_device_train_batch_size" in json.dumps(schema)
    r = gpuplan("gpus")
    assert "A100-80GB" in r.stdout and "MI300X" in r.stdout


def test_paths_resolve_relative_to_the_spec(tmp_path):
    r = gpuplan("plan", SPECS / "tiny.toml", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["model.config"]["value"] == str(MODELS / "tiny-llama-cpu.json")


@pytest.mark.parametrize("args", [[], ["plan"], ["nonsense"]])
def test_bad_invocations_exit_nonzero(args):
    assert gpuplan(*args).returncode != 0


def test_gpu_auto_detects_this_machine_and_falls_back_to_cpu(tmp_path):
    text = (SPECS / "tiny.toml").read_text().replace('gpu = "cpu"', 'gpu = "auto"')
    text = text.replace('"models/', f'"{MODELS}/').replace('"data/', f'"{SPECS}/data/')
    r = gpuplan("plan", write_spec(tmp_path, text), "--json")
    assert r.returncode == 0, r.stderr
    hw = json.loads(r.stdout)["hardware"]
    assert hw["name"] == "cpu" and hw["memory_bytes"] > 1024**3  # this host's RAM, not the nominal figure


def test_python_dash_m_gpuplan_help():
    """`python -m gpuplan --help` works (gpuplan/__main__.py) and lists the commands."""
    r = subprocess.run([sys.executable, "-m", "gpuplan", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: gpuplan ") and "plan" in r.stdout and "apply" in r.stdout
