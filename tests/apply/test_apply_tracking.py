"""Experiment tracking (training.report_to) and a clean log off a terminal, run for real (issue 15).

One real `gpuplan apply` with stdout and stderr redirected to a file trains with
TensorBoard on: the log has no carriage-return progress bars, the event files read back
with tensorboard's own reader hold the losses of metrics.jsonl, and the final model
directory holds only safetensors and JSON. MLflow's local store is read back with mlflow's
client.
"""

import json
import os
import subprocess

import pytest

from gpuplan.apply.train.arguments import tracking_environment
from gpuplan.plan.types import PlanError
from tests.helpers.cli_runs import command, env, run, tiny_spec
from tests.helpers.planning import ENV, plan_text, spec

TINY = dict(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 128", training='effective_batch_size = 16\nmax_steps = 5\nreport_to = "{}"')


def _train_losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if r["event"] == "train"]


def _apply_to_log(tmp_path, report_to: str):
    out = tmp_path / "run"
    spec_path = tiny_spec(tmp_path / "tracked.toml", out, max_steps=4, save_steps=100)
    text = spec_path.read_text().replace("seed = 0", f"seed = 0\nreport_to = {report_to}")
    spec_path.write_text(text)
    log = tmp_path / "apply.log"
    with open(log, "wb") as f:  # `gpuplan apply ... > log 2>&1`: no terminal anywhere
        r = run(
            command("apply", spec_path, "--yes"),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env(),
            cwd=tmp_path,
            timeout=600,
        )
    text = log.read_bytes().decode()
    assert r.returncode == 0, text
    return out, text


@pytest.mark.slow
def test_apply_to_a_log_file_with_tensorboard(tmp_path):
    out, log = _apply_to_log(tmp_path, '["tensorboard"]')
    assert "\r" not in log  # no progress bars redrawn in place
    lines = log.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split("  ")[0] for line in steps] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert any(line.startswith("data: ") and "training sequences of 32 tokens" in line for line in lines)
    assert any(line.startswith("model: llama with ") for line in lines)
    assert not any("Generating train split" in line or "Writing model shards" in line for line in lines)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = out / "tensorboard"
    assert any(p.name.startswith("events.out.tfevents.") for p in logdir.iterdir())
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    tb = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    jsonl = _train_losses(out)
    assert [s for s, _ in tb] == [s for s, _ in jsonl] == [1, 2, 3, 4]
    assert [v for _, v in tb] == pytest.approx([v for _, v in jsonl], rel=1e-6)  # event files store float32
    assert not (tmp_path / "runs").exists()  # nothing outside output.dir

    final = sorted(p.name for p in (out / "final").iterdir())
    assert final == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "training_args.json",
    ]
    assert json.loads((out / "final" / "training_args.json").read_text())["run_name"] == "tracked"


@pytest.mark.slow
def test_apply_with_mlflow_writes_a_local_store_mlflows_client_reads(tmp_path):
    out, _ = _apply_to_log(tmp_path, '"mlflow"')
    assert (out / "mlruns").is_dir() and not (tmp_path / "mlruns").exists()
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 keeps the file store behind this switch
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{out / 'mlruns'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    jsonl = _train_losses(out)
    assert [s for s, _ in history] == [s for s, _ in jsonl] == [1, 2, 3, 4]
    assert [v for _, v in history] == pytest.approx([v for _, v in jsonl], rel=1e-6)


def test_a_tracker_that_is_not_installed_is_a_plan_error_naming_the_pip_package(tmp_path):
    env = {**ENV, "trackers": {"tensorboard": True, "mlflow": True, "wandb": False, "comet_ml": False}}
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec(**{**TINY, "training": TINY["training"].replace('"{}"', '["tensorboard", "comet_ml"]')}), env=env)
    [d] = [d for d in e.value.diagnostics if d.severity == "error"]
    assert d.key == "training.report_to" and "'comet_ml', which is not installed" in d.summary
    assert d.fix.startswith("pip install comet-ml")
    plan = plan_text(tmp_path, spec(**{**TINY, "training": TINY["training"].format("tensorboard")}), env=env)
    [note] = [d for d in plan.diagnostics if d.key == "training.report_to"]
    assert f"TensorBoard event files in {os.path.join(plan.value('output.dir'), 'tensorboard')}" in note.summary


def test_report_to_defaults_none_and_run_name_defaults_to_the_spec_name(tmp_path):
    plan = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 128", training="effective_batch_size = 16"))
    assert plan.value("training.report_to") == "none" and plan.value("training.run_name") == "spec"
    assert not [d for d in plan.diagnostics if d.key == "training.report_to"]
    with pytest.raises(PlanError, match="training.report_to"):
        plan_text(tmp_path, spec(**{**TINY, "training": TINY["training"].format("tensorbord")}))


def test_tracker_locations_are_inside_output_dir_unless_the_environment_names_a_server(tmp_path):
    plan = plan_text(
        tmp_path,
        spec(**{**TINY, "training": TINY["training"].replace('"{}"', '["tensorboard", "mlflow"]')})
        + f'[output]\ndir = "{tmp_path / "out"}"\n',
    )
    assert tracking_environment(plan, {}) == {
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "out" / "tensorboard"),
        "MLFLOW_TRACKING_URI": f"file:{tmp_path / 'out' / 'mlruns'}",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }
    assert "MLFLOW_TRACKING_URI" not in tracking_environment(plan, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"})
