"""Calibration: measured runs scale the step-time model's terms; prices from the user and the spec."""

from __future__ import annotations

import json
import re
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
from gpuplan.plan.estimate import calibration
from gpuplan.plan.estimate.calibration import STEP_MODEL, calibrated_scale, calibration_assumption
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
        "step_model": STEP_MODEL,
        "arch_class": "ampere-dc",
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
        # priced by an earlier step-time model whose parts a later version moved (2: the CPU's; 3, the refit on
        # ms-swift's rows: every class's, the A100's included), or naming no class
        _record(run="/v1-moved", step_model=1, arch_class="cpu"),
        _record(run="/v2-moved", step_model=2),
        {k: v for k, v in _record(run="/v1-unnamed", step_model=1).items() if k != "arch_class"},
    ]
    assert calibrated_scale(records, A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5}) is None
    used = calibrated_scale([*records, _record(run="/now")], A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5})
    assert used is not None and used[1]["run"] == "/now" and used[1]["runs_used"] == 1
    assert calibrated_scale(records, lookup("H100-80GB"), 1, 1, key=KEY, modelled={})[1]["run"] == "/h100"


def test_an_earlier_models_record_on_a_class_no_later_change_moved_is_still_used(monkeypatch):
    """Version 3 moved every class, so no real record is kept across it; the rule itself, on version 2's table (which
    moved only the CPU's parts): an A100 record of version 1 is still used, a CPU one is not."""
    monkeypatch.setattr(calibration, "STEP_MODEL_CHANGES", {2: frozenset({"cpu"})})
    kept = _record(run="/v1-kept", step_model=1)
    assert calibration.current_model(kept) and not calibration.current_model({**kept, "arch_class": "cpu"})
    used = calibrated_scale([kept], A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5})
    assert used is not None and used[1]["run"] == "/v1-kept"


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
def test_plan_apply_plan_reproduces_the_runs_steady_rate(tmp_path, capsys):
    """Right after the apply, the plan of the same spec is within 5% of the run's own steady tokens/s
    (the rate after the first step, measured by that run: robust to a loaded machine), its run time is
    start-up + steps x step time, and `gpuplan show` prints plan vs measured."""
    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=30, seq_len=64, batch=8, save_steps=1000)
    assert main(["plan", str(spec), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)["throughput"]
    assert before["calibration"] is None and before["assumption"].startswith("step-time model, cpu constants")

    assert main(["apply", str(spec), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "calibration:" in out and str(calibration_path()) in out
    state = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())
    results = state["results"]
    measured = results["calibration"]
    steady = results["steady_tokens_per_second"]
    assert measured["gpu"] == "cpu" and measured["utilisation"] > 0 and 0 < measured["mfu"]
    assert measured["tokens_per_second"] == steady  # the steady rate, not the whole loop's
    assert measured["step_time_s"] == pytest.approx(measured["tokens_per_step"] / steady)
    assert measured["rate"] == "steady (after the first step)"
    assert measured["startup_s"] > 0 and measured["startup_s"] == pytest.approx(results["time_to_first_step_s"] - measured["step_time_s"])
    assert measured["peak_memory_bytes"] > 0

    assert main(["plan", str(spec), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)["throughput"]
    assert after["calibration"]["run"] == str(tmp_path / "run")
    assert after["calibration"]["measured"]["tokens_per_second"] == steady
    assert after["assumption"].startswith("step-time model, calibrated on this hardware")
    assert measured["key"] == {"dtype": "fp32", "method": "full", "gradient_checkpointing": False, "savers": []}
    with capsys.disabled():
        print(f"\nplan {before['tokens_per_second']:,.0f} -> {after['tokens_per_second']:,.0f} tokens/s; run steady {steady:,.0f}")
    assert after["tokens_per_second"] == pytest.approx(steady, rel=0.05)
    startup = measured["startup_s"] + measured["finish_s"]
    assert after["run_time_s"] == pytest.approx(startup + 30 * after["step_time_s"])
    assert after["calibration"]["startup_s"] == pytest.approx(startup)

    assert main(["show", str(tmp_path / "run")]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"tokens/s: [\d,]+ measured \(steady, after the first step\), [\d,]+ planned", shown), shown
    assert re.search(r"step time: [\d.]+ s measured, [\d.]+ s planned", shown), shown
    assert re.search(r"start-up: [\d.]+ s measured \(to the end of the first step\)", shown), shown

    assert main(["calibration"]) == 0
    assert str(tmp_path / "run") in capsys.readouterr().out
    assert main(["calibration", "--clear"]) == 0
    assert "Removed 1 measured run(s)" in capsys.readouterr().out
    assert main(["plan", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"]["calibration"] is None


def test_a_run_faster_than_the_probed_peak_is_recorded_and_says_so(tmp_path):
    """Under load the CPU peak probe reads low; a run past it was dropped without a word. Now it is
    recorded (the calibrated plan uses its step time, not the peak) and apply says why and how to re-probe."""
    from gpuplan.apply.train.calibrate import calibration_record, record_measurement
    from gpuplan.hardware.cpu_probe import probe_path

    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=30, seq_len=64, batch=8)
    plan = plan_file(spec, environment=local_environment())
    t = plan.throughput
    past_peak = 3 * t.peak_tflops * 1e12 / t.flops_per_token  # 3x what the probed peak allows
    results = {
        "tokens_per_second": past_peak / 2,
        "steady_tokens_per_second": past_peak,
        "steady_step_time_s": t.tokens_per_step / past_peak,
    }
    record = calibration_record(plan, results)
    assert record is not None and record["above_peak"] and record["utilisation"] == pytest.approx(3.0)
    assert record["tokens_per_second"] == past_peak and record["rate"] == "steady (after the first step)"
    said: list[str] = []
    record_measurement(plan, results, said.append)
    assert results["calibration"]["above_peak"] and read_calibrations()[-1]["run"] == str(tmp_path / "run")
    assert len(said) == 1 and "300% of the probed CPU peak" in said[0] and f"delete {probe_path()}" in said[0]
    # the next plan of the spec lands on the measured steady step, peak or no peak
    again = plan_file(spec, environment=local_environment(), calibrations=read_calibrations())
    assert again.throughput.tokens_per_second == pytest.approx(past_peak, rel=1e-6)


def test_the_modelled_slowdowns_are_divided_out_once():
    # a run with training.torch_empty_cache_steps (x 1.1 on top of the terms): the calibrated plan
    # multiplies its terms' step by 1.1 again, so the scale is of the step without it
    run = _record(step_time_s=3.1 * 1.1, slowdown=1.1)
    scale, _ = calibrated_scale([run], A100, 1, 1, key=KEY, modelled={"work": 1.0, "fixed": 0.5})
    assert scale == {"work": pytest.approx(2.0), "fixed": pytest.approx(2.0)}


def test_the_calibration_list_says_which_runs_an_earlier_step_time_model_priced(tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.jsonl"
    append_calibration({k: v for k, v in _record(run="/before", arch_class="cpu").items() if k != "step_model"}, path)
    append_calibration(_record(run="/now"), path)
    monkeypatch.setenv("GPUPLAN_CALIBRATION_FILE", str(path))
    assert main(["calibration"]) == 0
    out = capsys.readouterr().out
    before, now = (next(line for line in out.splitlines() if f" {run}" in line) for run in ("/before", "/now"))
    assert before.endswith("/before  (not used: an earlier step-time model)") and now.endswith(" /now")
    assert "1 of them were measured against an earlier version of the step-time model" in out
