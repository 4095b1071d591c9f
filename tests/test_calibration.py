"""Calibration: a measured run replaces the published efficiency; prices from the user and the spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers.cli_runs import tiny_spec

from gpuplan.cli.main import main
from gpuplan.hardware.catalog import lookup
from gpuplan.plan.build import plan_file
from gpuplan.plan.estimate.calibration import calibrated_efficiency
from gpuplan.plan.estimate.efficiency import default_efficiency
from gpuplan.plan.inputs.environment import local_environment
from gpuplan.userfiles import (
    UserFileError,
    append_calibration,
    calibration_path,
    read_calibrations,
    read_user_prices,
)

ROOT = Path(__file__).resolve().parent.parent
A100 = lookup("A100-80GB")


def _record(**kw):
    rec = {"gpu": "A100-80GB", "count": 1, "nodes": 1, "utilisation": 0.3, "flops_per_token": 6e9,
           "n_params": 1_000_000_000, "tokens_per_second": 1000.0, "step_time_s": 2.0, "mfu": 0.3, "run": "/r/one"}
    return {**rec, **kw}


def test_same_spec_takes_the_measured_utilisation():
    util, section = calibrated_efficiency([_record()], A100, 1, 1, n_params=1_000_000_000, flops_per_token=6e9)
    assert util == 0.3 and section["same_flops_per_token"] and section["run"] == "/r/one"


def test_other_sizes_scale_by_the_published_curve():
    util, section = calibrated_efficiency([_record()], A100, 1, 1, n_params=7_000_000_000, flops_per_token=42e9)
    ratio = default_efficiency(A100, 7_000_000_000)[0] / default_efficiency(A100, 1_000_000_000)[0]
    assert util == pytest.approx(0.3 * ratio) and section["size_scale"] == pytest.approx(ratio)


def test_nearest_run_in_flops_and_same_hardware_only():
    records = [_record(run="/far", flops_per_token=1e12), _record(run="/near", flops_per_token=7e9),
               _record(run="/other-count", count=8, flops_per_token=6e9), _record(run="/h100", gpu="H100-80GB")]
    _, section = calibrated_efficiency(records, A100, 1, 1, n_params=10**9, flops_per_token=6e9)
    assert section["run"] == "/near" and section["runs_on_this_hardware"] == 2
    assert calibrated_efficiency(records, lookup("B200"), 1, 1, n_params=10**9, flops_per_token=6e9) is None


def test_runs_of_two_sizes_fit_a_per_step_overhead():
    # measured: 1 s overhead + 1e-12 s per FLOP, at 4e12 and 8e12 FLOPs per step (1000 tokens per step)
    runs = [_record(run="/s", flops_per_token=4e9, tokens_per_step=1000, step_time_s=5.0),
            _record(run="/l", flops_per_token=8e9, tokens_per_step=1000, step_time_s=9.0)]
    util, section = calibrated_efficiency(runs, A100, 1, 1, n_params=10**9, flops_per_token=6e9,
                                          tokens_per_step=1000, peak_tflops=312.0)
    assert section["fit"]["overhead_s"] == pytest.approx(1.0) and section["fit"]["runs"] == 2
    step = 1.0 + 6e12 * 1e-12  # what the fitted line says for this spec
    assert util == pytest.approx(6e12 / (step * 312e12))
    assert section["fit"]["from"] == ["/s", "/l"]
    # a run of this very spec wins over the fit
    _, section = calibrated_efficiency([*runs, _record(run="/same", flops_per_token=6e9)], A100, 1, 1,
                                       n_params=10**9, flops_per_token=6e9, tokens_per_step=1000, peak_tflops=312.0)
    assert section["run"] == "/same" and "fit" not in section


def test_store_skips_broken_lines(tmp_path):
    path = tmp_path / "c.jsonl"
    append_calibration(_record(), path)
    with open(path, "a") as f:
        f.write('{"gpu": "A100-80GB", "utilis\n[1, 2]\n')
    append_calibration(_record(run="/r/two"), path)
    assert [r["run"] for r in read_calibrations(path)] == ["/r/one", "/r/two"]


def test_user_prices_and_spec_price(tmp_path, monkeypatch):
    prices = tmp_path / "prices.toml"
    prices.write_text('[prices]\n"a100 80gb" = 1.5\n')
    monkeypatch.setenv("GPUPLAN_PRICES_FILE", str(prices))
    assert read_user_prices() == {"A100-80GB": (1.5, f"your prices file {prices}")}
    spec = ROOT / "specs" / "llama-8b-a100.toml"
    env = local_environment()
    t = plan_file(spec, environment=env, prices=read_user_prices()).throughput
    assert t.price_per_gpu_hour == 1.5 and t.cost_usd == pytest.approx(t.run_time_s / 3600 * 1.5)
    t = plan_file(spec, environment=env, prices=read_user_prices(),
                  overrides={"hardware": {"price_per_hour": 0.5}}).throughput
    assert (t.price_per_gpu_hour, t.price_source) == (0.5, "the spec's hardware.price_per_hour")
    assert plan_file(spec, environment=env).throughput.price_source.startswith("catalog: Lambda")


@pytest.mark.parametrize("text, message", [
    ('[prices]\nA100-80GB = "cheap"\n', "prices.A100-80GB = 'cheap' is not a price"),
    ("[prices]\ntpu-v9 = 1.0\n", "prices.tpu-v9: unknown GPU 'tpu-v9'"),
    ("A100-80GB = 1.0\n", "no [prices] table"),
    ("[prices\n", "cannot read the prices file"),
])
def test_bad_prices_file_is_a_clear_error(tmp_path, monkeypatch, capsys, text, message):
    prices = tmp_path / "prices.toml"
    prices.write_text(text)
    with pytest.raises(UserFileError, match=message.replace("[", r"\[")):
        read_user_prices(prices)
    monkeypatch.setenv("GPUPLAN_PRICES_FILE", str(prices))
    assert main(["plan", str(ROOT / "specs" / "tiny.toml")]) == 1
    err = capsys.readouterr().err
    assert str(prices) in err and "Traceback" not in err


@pytest.mark.slow  # one real (tiny) training run on the CPU
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_plan_apply_plan_calibrates_the_time(tmp_path, capsys):
    """The second plan's step time is within 20% of what the run measured, and says where it came from."""
    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=30, seq_len=64, batch=8, save_steps=1000)
    assert main(["plan", str(spec), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)["throughput"]
    assert before["calibration"] is None and "measured on a 2-core CPU" in before["assumption"]

    assert main(["apply", str(spec), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "calibration:" in out and str(calibration_path()) in out
    state = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())
    measured = state["results"]["calibration"]
    assert measured["gpu"] == "cpu" and 0 < measured["utilisation"] <= 1 and 0 < measured["mfu"] <= 1
    assert measured["step_time_s"] == pytest.approx(measured["tokens_per_step"] / state["results"]["tokens_per_second"])
    assert measured["peak_memory_bytes"] > 0

    assert main(["plan", str(spec), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)["throughput"]
    assert after["calibration"]["run"] == str(tmp_path / "run")
    assert after["calibration"]["measured"]["tokens_per_second"] == measured["tokens_per_second"]
    assert after["assumption"].startswith(f"{measured['utilisation']:.1%} of peak dense fp32 TFLOP/s, calibrated")
    assert after["step_time_s"] == pytest.approx(measured["step_time_s"], rel=0.20)
    assert after["run_time_s"] == pytest.approx(30 * measured["step_time_s"], rel=0.20)

    assert main(["calibration"]) == 0
    assert str(tmp_path / "run") in capsys.readouterr().out
    assert main(["calibration", "--clear"]) == 0
    assert "Removed 1 measured run(s)" in capsys.readouterr().out
    assert main(["plan", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"]["calibration"] is None
