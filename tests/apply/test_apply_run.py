"""execute(plan) end to end on CPU: loss, metrics.jsonl, gpuplan-state.json, safetensors, failures."""

from __future__ import annotations

import json
import os

import pytest

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.train.execute import execute
from gpuplan.lifecycle.state import RunState, write_json_atomic
from gpuplan.lifecycle.state import load_state as read_state
from tests.helpers.apply_plans import cpu_plan, read_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One real 40-step run shared by the read-only checks below."""
    tmp = tmp_path_factory.mktemp("tiny")
    plan = cpu_plan(
        tmp,
        **{
            "training.max_steps": 40,
            "training.logging_steps": 5,
            "training.save_steps": 20,
            "training.save_total_limit": 1,
            "data.eval_fraction": 0.05,
            "training.eval_steps": 20,
            "training.per_device_train_batch_size": 8,
            "training.gradient_accumulation_steps": 2,
            "training.effective_batch_size": 16,
            "training.warmup_steps": 4,
        },
    )
    lines: list[str] = []
    results = execute(plan, echo=lines.append, progress=False)
    return plan, results, lines


def test_loss_falls_clearly(tiny_run):
    _, results, _ = tiny_run
    assert results["global_step"] == 40
    assert results["train_loss_first"] > 5.0  # ~ln(260): a uniform guess over the byte vocabulary
    assert results["train_loss_last"] < results["train_loss_first"] - 1.0
    assert results["eval_loss_last"] is not None and results["eval_loss_last"] < results["train_loss_first"] - 1.0


def test_metrics_jsonl_has_one_object_per_logging_step(tiny_run):
    plan, results, _ = tiny_run
    records = read_jsonl(os.path.join(plan.value("output.dir"), "metrics.jsonl"))
    train = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in train] == [1, 5, 10, 15, 20, 25, 30, 35, 40]  # logging_first_step + every 5
    for r in train:
        assert r["loss"] > 0 and r["tokens_per_second"] > 0 and r["elapsed_s"] >= 0
        assert r["learning_rate"] is not None and r["samples_seen"] == r["step"] * 16
    assert train[0]["loss"] == results["train_loss_first"] and train[-1]["loss"] == results["train_loss_last"]
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [20, 40] and all("eval_loss" in r for r in evals)


def test_state_file_holds_the_plan_and_the_results(tiny_run):
    plan, results, _ = tiny_run
    state = read_state(plan.value("output.dir"))
    assert state["format_version"] == 1 and state["status"] == "completed" and state["error"] is None
    assert state["plan"] == json.loads(json.dumps(plan.to_dict()))
    assert state["started_at"] <= state["finished_at"]
    assert state["progress"] == {"global_step": 40, "max_steps": 40, "samples_seen": 640}
    res = state["results"]
    assert res["peak_rss_bytes"] > 10 * 2**20 and res["tokens_per_second"] > 0 and res["runtime_s"] > 0
    assert res["train_loss_first"] == results["train_loss_first"]
    assert res["train_loss_last"] == results["train_loss_last"]
    assert res["tokens_per_step"] == 16 * 64


def test_final_model_is_safetensors_and_reloads(tiny_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    plan, results, _ = tiny_run
    final = results["final_model_dir"]
    assert os.path.isfile(os.path.join(final, "model.safetensors"))
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in os.listdir(final))  # no pickle at all
    model = AutoModelForCausalLM.from_pretrained(final)
    tok = AutoTokenizer.from_pretrained(final)
    ids = torch.tensor([tok("the miller walked to the", add_special_tokens=False)["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], 260)
    checkpoints = [n for n in os.listdir(plan.value("output.dir")) if n.startswith("checkpoint-")]
    assert checkpoints == ["checkpoint-40"]  # save_total_limit = 1
    assert os.path.isfile(os.path.join(plan.value("output.dir"), "checkpoint-40", "model.safetensors"))


def test_summary_compares_with_the_plan(tiny_run):
    _, results, lines = tiny_run
    summary = "\n".join(lines[-4:])
    assert "peak memory:" in summary and "plan 0.05 GiB allocated" in summary
    assert "throughput:" in summary and "plan 20,000 tokens/s" in summary
    assert f"loss: {results['train_loss_first']:.4f} -> {results['train_loss_last']:.4f} over 40 steps" in summary
    assert any(line.startswith("step 40/40") for line in lines)  # per-log echo without a progress bar


def test_user_error_marks_the_state_failed(tmp_path):
    plan = cpu_plan(tmp_path, **{"data.train_files": [str(tmp_path / "missing.txt")]})
    with pytest.raises(ApplyError, match="missing.txt does not exist"):
        execute(plan, echo=lambda s: None, progress=False)
    state = read_state(plan.value("output.dir"))
    assert state["status"] == "failed" and "missing.txt does not exist" in state["error"]
    assert state["finished_at"] is not None


def test_cpu_plan_that_cpu_cannot_honour_fails_before_training(tmp_path):
    plan = cpu_plan(tmp_path, **{"training.dataloader_pin_memory": True})
    with pytest.raises(ApplyError, match="cannot honour"):
        execute(plan, echo=lambda s: None, progress=False)
    assert read_state(plan.value("output.dir")) is None  # nothing started


def test_state_writes_are_atomic_and_leave_no_temp_files(tmp_path):
    plan = cpu_plan(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    state = RunState(plan, str(out))
    state.progress(3, 10, 24)
    assert read_state(str(out))["progress"] == {"global_step": 3, "max_steps": 10, "samples_seen": 24}
    state.finish("interrupted", {"global_step": 3}, error="interrupted by the user")
    assert read_state(str(out))["status"] == "interrupted"
    assert os.listdir(out) == ["gpuplan-state.json"]
    with pytest.raises(TypeError):
        write_json_atomic(str(out / "gpuplan-state.json"), {"bad": object()})
    assert read_state(str(out))["status"] == "interrupted"  # the old file survives a failed write
    assert os.listdir(out) == ["gpuplan-state.json"]


def test_resume_from_a_checkpoint_continues_the_run(tmp_path):
    first = cpu_plan(tmp_path, **{"training.max_steps": 4, "training.save_steps": 2, "training.save_total_limit": 2})
    execute(first, echo=lambda s: None, progress=False)
    out = first.value("output.dir")
    ckpt = os.path.join(out, "checkpoint-4")
    assert os.path.isfile(os.path.join(ckpt, "trainer_state.json"))
    # a longer run of the same training continues from step 4
    second = cpu_plan(tmp_path, **{"training.max_steps": 6, "training.save_steps": 2, "training.save_total_limit": 2})
    results = execute(second, echo=lambda s: None, progress=False, resume_from=ckpt)
    assert results["global_step"] == 6
    steps = [r["step"] for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if r["event"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # the resumed run appends to the first run's lines
    state = read_state(out)
    assert state["resumed_from"] == ckpt and state["progress"]["global_step"] == 6


def test_resume_from_something_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ApplyError, match="not a Trainer checkpoint"):
        execute(cpu_plan(tmp_path), echo=lambda s: None, progress=False, resume_from=str(tmp_path))
