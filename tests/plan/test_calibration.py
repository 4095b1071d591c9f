"""Calibration: measured runs scale the step-time model's terms; prices from the user and the spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan.cli.main import main
from gpuplan.hardware.catalog import lookup
from gpuplan.hardware.userfiles import (
    UserFileError,
    append_calibration,
    calibration_path,
    read_calibrations,
    read_user_prices,
)
from gpuplan.plan.build import plan_file
from gpuplan.plan.estimate.calibration import calibrated_scale, calibration_assumption
from gpuplan.plan.inputs.environment import local_environment
from tests.helpers.cli_runs import tiny_spec

ROOT = Path(__file__).resolve().parents[2]
A100 = lookup("A100-80GB")


KEY = {"dtype": "bf16", "method": "lora", "gradient_checkpointing": True, "savers": []}


def _record(**kw):
    rec = {
        "gpu": "A100-80GB",
        "count": 1,
        "nodes": 1,
        "utilisation": 0.3,
        "flops_per_token": 6e9,
        "n_params": 1_000_000_000,
        "tokens_per_second": 1000.0,
        "step_time_s": 3.1,
        "mfu": 0.3,
        "run": "/r/one",
        "modelled_s": {"work": 1.0, "fixed": 0.5, "other": 0.1},
        "key": KEY,
    }
    return {**rec, **kw}


def test_the_measured_spec_lands_on_its_measured_step():
    # (3.1 - 0.1) / (1.0 + 0.5) = 2: both parts x 2, so the plan of that spec is 2 x 1.5 + 0.1 = 3.1 s
    scale, section = calibrated_scale([_record()], A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5})
    assert scale == {"work": 2.0, "fixed": 2.0}
    assert section["run"] == "/r/one" and section["same_key"] and section["carried_across"] == []
    assert calibration_assumption(section).startswith(
        "step-time model, calibrated on this hardware: the model's terms x 2.00 (measured 1,000 tokens/s in /r/one)"
    )


def test_an_fp32_run_carries_to_a_bf16_plan_through_the_terms():
    # a 300 tokens/s fp32 run the model priced right (scale 1) leaves a bf16 plan at the model's own bf16
    # time: the dtype's 16x larger peak is in the terms already, nothing is multiplied by it
    fp32 = {**KEY, "dtype": "fp32"}
    run = _record(key=fp32, tokens_per_second=300.0, step_time_s=1.6)
    scale, section = calibrated_scale([run], A100, 1, 1, key=KEY, modelled={"work": 0.2, "fixed": 0.1})
    assert scale == {"work": pytest.approx(1.0), "fixed": pytest.approx(1.0)}
    assert not section["same_key"] and section["carried_across"] == ["dtype 'fp32' -> 'bf16'"]
    assert "carried across dtype 'fp32' -> 'bf16' through the model's terms" in calibration_assumption(section)


def test_a_qlora_run_does_not_set_a_lora_plan_when_a_lora_run_exists():
    qlora = _record(run="/q", key={**KEY, "method": "qlora"}, step_time_s=6.1)
    lora = _record(run="/l")
    scale, section = calibrated_scale([lora, qlora], A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5})
    assert section["run"] == "/l" and section["runs_used"] == 1 and section["runs_on_this_hardware"] == 2
    assert scale["work"] == pytest.approx(2.0)


def test_runs_of_two_mixes_fit_work_and_fixed_apart():
    # s_w x 1 + s_f x 1 = 3 and s_w x 2 + s_f x 0.5 = 4.5  ->  s_w = 2, s_f = 1
    runs = [
        _record(run="/a", modelled_s={"work": 1.0, "fixed": 1.0, "other": 0.0}, step_time_s=3.0),
        _record(run="/b", modelled_s={"work": 2.0, "fixed": 0.5, "other": 0.0}, step_time_s=4.5),
    ]
    scale, section = calibrated_scale(runs, A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 1.0})
    assert scale == {"work": pytest.approx(2.0), "fixed": pytest.approx(1.0)}
    assert "work x 2.00, fixed costs x 1.00 (fitted over 2 measured runs)" in calibration_assumption(section)


def test_same_hardware_only_and_records_before_the_model_are_not_used():
    records = [
        _record(run="/other-count", count=8),
        _record(run="/h100", gpu="H100-80GB"),
        {k: v for k, v in _record(run="/old").items() if k != "modelled_s"},
    ]
    assert calibrated_scale(records, A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5}) is None
    assert calibrated_scale(records, lookup("H100-80GB"), 1, 1, key=KEY, modelled={})[1]["run"] == "/h100"


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
    t = plan_file(spec, environment=env, prices=read_user_prices(), overrides={"hardware": {"price_per_hour": 0.5}}).throughput
    assert (t.price_per_gpu_hour, t.price_source) == (0.5, "the spec's hardware.price_per_hour")
    assert plan_file(spec, environment=env).throughput.price_source.startswith("catalog: Lambda")


@pytest.mark.parametrize(
    "text, message",
    [
        ('[prices]\nA100-80GB = "cheap"\n', "prices.A100-80GB = 'cheap' is not a price"),
        ("[prices]\ntpu-v9 = 1.0\n", "prices.tpu-v9: unknown GPU 'tpu-v9'"),
        ("A100-80GB = 1.0\n", "no [prices] table"),
        ("[prices\n", "cannot read the prices file"),
    ],
)
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
    assert before["calibration"] is None and before["assumption"].startswith("step-time model, cpu constants")

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
    assert after["assumption"].startswith("step-time model, calibrated on this hardware")
    assert measured["key"] == {"dtype": "fp32", "method": "full", "gradient_checkpointing": False, "savers": []}
    assert after["step_time_s"] == pytest.approx(measured["step_time_s"], rel=0.20)
    assert after["run_time_s"] == pytest.approx(30 * measured["step_time_s"], rel=0.20)

    assert main(["calibration"]) == 0
    assert str(tmp_path / "run") in capsys.readouterr().out
    assert main(["calibration", "--clear"]) == 0
    assert "Removed 1 measured run(s)" in capsys.readouterr().out
    assert main(["plan", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"]["calibration"] is None
