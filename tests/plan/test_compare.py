"""`gpuplan compare` and the cannot-fit alternatives: the same planner, many hardware choices."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from gpuplan.cli.main import main
from gpuplan.plan.build import plan_file, plan_spec, with_overrides
from gpuplan.plan.compare import compare, default_gpus, sort_rows
from gpuplan.plan.inputs.environment import local_environment
from gpuplan.plan.types import PlanError
from gpuplan.spec.load import load_toml

ROOT = Path(__file__).resolve().parents[2]
LLAMA_8B = ROOT / "specs" / "llama-8b-a100.toml"
ENV = local_environment()


def test_catalog_has_twenty_accelerators():
    assert len(default_gpus()) >= 20


def test_compare_rows_fit_and_cost():
    rows = compare(load_toml(LLAMA_8B), gpus=["A100-80GB", "RTX-4090", "RTX-5090"], counts=[1, 4], environment=ENV)
    by = {(r["gpu"], r["count"]): r for r in rows}
    assert set(by) == {(g, c) for g in ("A100-80GB", "RTX-4090", "RTX-5090") for c in (1, 4)}
    one = by[("A100-80GB", 1)]
    assert one["fits"] and one["nodes"] == 1 and one["precision"] == "bf16"
    assert one["per_device_train_batch_size"] * one["gradient_accumulation_steps"] == 64
    assert one["reserved_peak_bytes"] <= one["capacity_bytes"]
    # cost = run time x GPUs x the catalog's price
    assert one["cost_usd"] == pytest.approx(one["run_time_s"] / 3600 * 2.79)
    assert not by[("RTX-4090", 1)]["fits"] and by[("RTX-4090", 1)]["needs_bytes"] > by[("RTX-4090", 1)]["capacity_bytes"]
    four = by[("RTX-4090", 4)]
    assert four["fits"] and four["sharding"].startswith("FSDP")
    assert by[("RTX-5090", 4)]["fits"] and by[("RTX-5090", 4)]["cost_usd"] is None  # no price in the catalog
    # sorted: fits first, known cost ascending, then unknown cost; the first is marked best
    fits = [r for r in rows if r["fits"]]
    assert rows[: len(fits)] == fits and rows[0]["best"] and not any(r["best"] for r in rows[1:])
    costs = [r["cost_usd"] for r in fits if r["cost_usd"] is not None]
    assert costs == sorted(costs)
    assert fits[-1]["cost_usd"] is None


def test_sort_by_time():
    rows = [
        {"gpu": "a", "count": 1, "fits": True, "cost_usd": 1.0, "run_time_s": 9.0},
        {"gpu": "b", "count": 1, "fits": True, "cost_usd": 5.0, "run_time_s": 2.0},
        {"gpu": "c", "count": 1, "fits": False},
    ]
    assert [r["gpu"] for r in sort_rows(rows, "time")] == ["b", "a", "c"]
    assert [r["gpu"] for r in sort_rows(rows, "cost")] == ["a", "b", "c"]


def test_counts_past_a_node_go_on_nodes():
    rows = compare(load_toml(LLAMA_8B), gpus=["GH200", "H100-80GB"], counts=[2, 16], environment=ENV)
    by = {(r["gpu"], r["count"]): r for r in rows}
    assert (by[("GH200", 2)]["nodes"], by[("GH200", 2)]["gpus_per_node"]) == (2, 1)  # one superchip per node
    assert (by[("H100-80GB", 16)]["nodes"], by[("H100-80GB", 16)]["gpus_per_node"]) == (2, 8)
    assert (by[("H100-80GB", 2)]["nodes"], by[("H100-80GB", 2)]["gpus_per_node"]) == (1, 2)


def test_compare_cli_text_and_json(capsys):
    assert main(["compare", str(LLAMA_8B), "--gpus", "A100-80GB,4090", "--counts", "1,4"]) == 0
    out = capsys.readouterr().out
    assert "gpuplan compare:" in out and "* cheapest fit:" in out
    assert any(line.startswith("*") and "yes" in line for line in out.splitlines())
    assert "needs 36.1 GiB of 24" in out
    assert main(["compare", str(LLAMA_8B), "--gpus", "A100-80GB", "--counts", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = data["rows"][0]
    for key in (
        "gpu",
        "count",
        "nodes",
        "fits",
        "per_device_train_batch_size",
        "reserved_peak_bytes",
        "step_time_s",
        "run_time_s",
        "cost_usd",
    ):
        assert key in row


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--counts", "1,x"], "--counts '1,x': give GPU counts"),
        (["--counts", "0"], "--counts '0'"),
        (["--gpus", "tpu-v9"], "--gpus: unknown GPU 'tpu-v9'"),
    ],
)
def test_compare_bad_flags(capsys, flags, message):
    assert main(["compare", str(LLAMA_8B), *flags]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_8b_on_a_4090_names_a_larger_gpu_and_a_count_that_fit():
    with pytest.raises(PlanError) as e:
        plan_file(LLAMA_8B, environment=ENV, overrides={"hardware": {"gpu": "RTX-4090"}})
    fit = next(d for d in e.value.diagnostics if d.summary.startswith("does not fit"))
    assert 'a larger GPU: hardware.gpu = "A100-40GB"' in fit.fix  # the 32 GB RTX-5090 is too small
    import re

    (count,) = re.findall(r"(\d+) x RTX-4090: hardware.count = \1 ", fit.fix)  # the fewest that fit
    assert int(count) > 1 and "FSDP full_shard" in fit.fix
    # every piece of advice, followed, fits (the same planner says so)
    raw = with_overrides(load_toml(LLAMA_8B).raw, {"hardware": {"gpu": "RTX-4090"}})
    for hw in ({"gpu": "A100-40GB"}, {"count": int(count)}):
        spec = dict(raw, hardware={**raw["hardware"], **hw})
        plan = plan_spec(dataclasses.replace(load_toml(LLAMA_8B), raw=spec), detect=None, environment=ENV)
        assert plan.memory.fits


def test_no_alternative_is_advised_when_nothing_fits(tmp_path):
    spec = tmp_path / "huge.toml"
    spec.write_text(
        LLAMA_8B.read_text()
        .replace('config = "models/', f'config = "{ROOT}/specs/models/')
        .replace('"data/', f'"{ROOT}/specs/data/')
        .replace("seq_len = 2048", "seq_len = 1048576")
    )
    with pytest.raises(PlanError) as e:
        plan_file(spec, environment=ENV, overrides={"hardware": {"gpu": "T4"}})
    fixes = [d.fix or "" for d in e.value.diagnostics]
    assert any("no catalog GPU fits at 1 GPU(s), nor up to 64 x T4" in f for f in fixes)
    # nor does a one-key hardware fix say otherwise: each was planned in full above and none fitted
    assert not any("hardware.gpu =" in f or "hardware.count =" in f for f in fixes), fixes
    assert "a T4 has 15 GiB" in e.value.diagnostics[0].summary


def test_other_errors_keep_the_hardware_that_fits_from_being_planned_and_the_fix_says_so(tmp_path):
    """A spec that does not fit and names a missing data file: no other hardware plans in full (the
    data error fails each plan too), so the fix says that, not "no catalog GPU fits", and keeps the
    memory fit's one-key hardware fixes; with the data file back, the one it names fits."""
    text = LLAMA_8B.read_text().replace('config = "models/', f'config = "{ROOT}/specs/models/')
    good = text.replace('"data/', f'"{ROOT}/specs/data/')
    (tmp_path / "missing.toml").write_text(text.replace('"data/tiny-corpus.txt"', f'"{tmp_path}/gone.txt"'))
    with pytest.raises(PlanError) as e:
        plan_file(tmp_path / "missing.toml", environment=ENV, overrides={"hardware": {"gpu": "T4"}})
    errors = [d for d in e.value.diagnostics if d.severity == "error"]
    assert {d.key for d in errors} == {"hardware.gpu", "data.train_files[0]"}
    fix = next(d.fix for d in errors if d.key == "hardware.gpu")
    assert "no catalog GPU fits" not in fix
    assert "no other hardware could be planned in full with the spec's other error (listed with this one) still in it" in fix
    (gpu,) = re.findall(r'hardware.gpu = "([^"]+)"', fix)
    (tmp_path / "good.toml").write_text(good)
    assert plan_file(tmp_path / "good.toml", environment=ENV, overrides={"hardware": {"gpu": gpu}}).memory.fits


def test_compare_times_come_from_the_step_time_model():
    """compare's step and run time are the plan's, from the step-time model, and say what bounds them;
    FSDP CPU offload over PCIe is priced (its copies and the CPU optimizer step), not free."""
    rows = compare(load_toml(LLAMA_8B), gpus=["A100-80GB", "RTX-3090"], counts=[1, 2], environment=ENV)
    by = {(r["gpu"], r["count"]): r for r in rows}
    one = by[("A100-80GB", 1)]
    plan = plan_file(LLAMA_8B, environment=ENV)
    assert one["step_time_s"] == pytest.approx(plan.throughput.step_time_s)
    assert one["bound_by"] == plan.throughput.step_time["bound_by"] == "matmuls"
    assert sum(one["step_shares"].values()) == pytest.approx(1.0)
    offload = by[("RTX-3090", 2)]
    assert offload["sharding"].endswith("CPU offload")
    # pinned DMA copies at HOST_COPY_FRACTION of the 3090's PCIe figure: a few percent of a step, never free
    assert offload["step_shares"].get("offload", 0) > 0.01


def test_compare_without_max_steps_prices_by_the_hour_and_shows_the_specs_savers(tmp_path, capsys, monkeypatch):
    """An init-written spec trains num_train_epochs (no max_steps): the run time is unknown, the
    price is not. Each priced row shows its $/h, the cheapest is named by cost per step with the word
    that the run time is unknown, the savers the spec turns on are in the savers column, and the
    prices footer names the file read ($XDG_CONFIG_HOME/gpuplan/prices.toml)."""
    spec = tmp_path / "epochs.toml"
    spec.write_text(
        LLAMA_8B.read_text()
        .replace('config = "models/', f'config = "{ROOT}/specs/models/')
        .replace('"data/', f'"{ROOT}/specs/data/')
        .replace("max_steps = 1000", "num_train_epochs = 3\ngradient_checkpointing = true")
    )
    xdg = tmp_path / "xdg"
    (xdg / "gpuplan").mkdir(parents=True)
    (xdg / "gpuplan" / "prices.toml").write_text('[prices]\n"H100-80GB" = 4.00\n')
    monkeypatch.delenv("GPUPLAN_PRICES_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    assert main(["compare", str(spec), "--gpus", "A100-80GB,H100-80GB,RTX-5090", "--counts", "1,2", "--json"]) == 0
    rows = [r for r in json.loads(capsys.readouterr().out)["rows"] if r["fits"]]
    assert {r["gpu"] for r in rows} == {"A100-80GB", "H100-80GB", "RTX-5090"}
    assert main(["compare", str(spec), "--gpus", "A100-80GB,H100-80GB,RTX-5090", "--counts", "1,2"]) == 0
    out = capsys.readouterr().out
    cells_of = (line[1:].split() for line in out.splitlines())  # after the "*" column
    table = {(c[0], c[1]): c for c in cells_of if len(c) > 2 and c[2] == "yes"}
    price = {"A100-80GB": 2.79, "H100-80GB": 4.00}  # the catalog's, and the XDG prices file's
    for r in rows:
        assert r["run_time_s"] is None and r["cost_usd"] is None
        cells = table[(r["gpu"], str(r["count"]))]
        assert "ckpt" in cells[5].split("+")  # the spec's gradient_checkpointing = true
        if r["gpu"] in price:
            assert cells[-1] == f"${price[r['gpu']] * r['count']:.2f}/h"
        else:
            assert cells[-1:] == ["price"]  # "no price": the catalog has none for the RTX-5090
    priced = [r for r in rows if r["gpu"] in price]
    cheapest = min(priced, key=lambda r: r["step_time_s"] * price[r["gpu"]] * r["count"])
    assert rows[0] == cheapest and rows[0]["best"]  # ranked by cost per step: every row trains the same steps
    per_step = cheapest["step_time_s"] * price[cheapest["gpu"]] * cheapest["count"] / 3600
    assert (
        f"* cheapest fit: {cheapest['count']} x {cheapest['gpu']}, " in out
        and f" at ${price[cheapest['gpu']] * cheapest['count']:.2f}/h (~${per_step:.4f} per step); run time unknown, so no total cost"
        in out
    )
    assert "~-" not in out
    assert f"your prices: {xdg / 'gpuplan' / 'prices.toml'}" in out
    assert main(["gpus"]) == 0
    assert f"Override prices in {xdg / 'gpuplan' / 'prices.toml'}" in capsys.readouterr().out
