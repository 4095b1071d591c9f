"""`gpuplan tune SPEC`: real short runs of the fit search's top candidates, the fastest written into the spec."""

from __future__ import annotations

import json
import re

import pytest

from gpuplan.cli.main import main
from tests.helpers.cli_runs import gpuplan, tiny_spec


def _spec(tmp_path):
    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=30, seq_len=32, batch=4, save_steps=1000)
    text = spec.read_text().replace("[training]\n", "# my training settings: keep this comment\n[training]\n")
    spec.write_text(text)
    return spec


@pytest.mark.slow  # two real (tiny) training runs of 3 steps on the CPU
def test_tune_times_real_candidates_and_writes_the_fastest(tmp_path):
    from gpuplan.plan.build import plan_file
    from gpuplan.plan.inputs.environment import local_environment

    spec = _spec(tmp_path)
    original = spec.read_text()
    before = plan_file(spec, environment=local_environment())
    r = gpuplan("tune", spec, "--top", "2", "--steps", "3", "--budget", "300", GPUPLAN_CALIBRATION_FILE=str(tmp_path / "cal.jsonl"))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "Traceback" not in r.stderr
    results = json.loads((tmp_path / "run" / "tune-results.json").read_text())["results"]
    measured = [v for v in results.values() if v["measured"].get("steady_tokens_per_second")]
    assert len(measured) == 2 and len({json.dumps(v["settings"], sort_keys=True) for v in measured}) == 2
    rows = [line for line in r.stdout.splitlines() if line.endswith("  measured")]
    assert len(rows) == 2, r.stdout
    for v in measured:  # each row: planned, then measured tokens/s and their ratio
        row = next(line for line in rows if line.startswith(v["label"] + " "))
        shown = f"{v['measured']['steady_tokens_per_second']:,.0f}"
        assert re.search(rf"\s[\d,]+\s+{re.escape(shown)}\s+[\d.]+x\s", row), row
    best = max(measured, key=lambda v: v["measured"]["steady_tokens_per_second"])
    assert f"Fastest: {best['label']}:" in r.stdout
    text = spec.read_text()
    assert "# my training settings: keep this comment" in text  # the user's comments and layout stay
    after = plan_file(spec, environment=local_environment())
    assert all(after.value(k) == v for k, v in best["settings"].items()), best  # the spec now runs the fastest
    changed = {k for k, v in best["settings"].items() if before.value(k) != v}
    for key in changed:  # each key tune set carries its reason; the others are as they were
        name = key.split(".", 1)[1]
        assert re.search(rf"^{name} = .*# gpuplan tune \d{{4}}-\d\d-\d\d: {re.escape(best['label'])}", text, re.M), text
    if not changed:
        assert "It is what the plan runs already" in r.stdout and text == original
    # the measurements calibrate later plans (apply/train/calibrate.py, one record per candidate)
    assert len((tmp_path / "cal.jsonl").read_text().splitlines()) == 2
    # the candidates' short runs keep their state and metrics, not their weights or checkpoints
    for d in (tmp_path / "run" / "tune").iterdir():
        assert sorted(p.name for p in d.iterdir() if p.is_dir()) == []

    # rerun with no time to spare: what was measured is reused, nothing new is timed
    again = gpuplan("tune", spec, "--top", "2", "--steps", "3", "--budget", "0.001", GPUPLAN_CALIBRATION_FILE=str(tmp_path / "cal.jsonl"))
    reused = [line for line in again.stdout.splitlines() if "reused (measured by an earlier tune)" in line]
    skipped = [line for line in again.stdout.splitlines() if "skipped: its ~" in line and "would pass the budget" in line]
    assert reused and len(reused) + len(skipped) == 2, again.stdout
    assert len((tmp_path / "cal.jsonl").read_text().splitlines()) == 2  # nothing trained
    assert again.returncode == 0, again.stderr + again.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budget", "0"], "--budget 0: the budget is seconds of timing, more than 0"),
        (["--steps", "1"], "--steps 1: a candidate needs 2 steps or more"),
        (["--top", "0"], "--top 0: time at least one candidate"),
    ],
)
def test_bad_flags_are_clear_errors(tmp_path, capsys, argv, message):
    spec = _spec(tmp_path)
    before = spec.read_text()
    assert main(["tune", str(spec), *argv]) == 1
    err = capsys.readouterr()
    assert message in err.err + err.out and "Traceback" not in err.err
    assert spec.read_text() == before and not (tmp_path / "run").exists()  # nothing written


def test_a_missing_spec_or_a_plan_file_is_a_clear_error(tmp_path, capsys):
    assert main(["tune", str(tmp_path / "nope.toml")]) == 1
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "p.json").write_text("{}")
    assert main(["tune", str(tmp_path / "p.json")]) == 1
    assert "tune edits a spec file (.toml)" in capsys.readouterr().err
