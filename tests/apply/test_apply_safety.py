"""Crash safety, Ctrl-C, out-of-memory re-planning and safe loading, on the real CLI and Trainer."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import time

import pytest

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.train.checkpoints import MARKER, checkpoint_problem
from gpuplan.apply.train.execute import execute
from gpuplan.lifecycle.state import load_state as read_state
from gpuplan.plan.types import PlanError
from tests.helpers.apply_plans import cpu_plan, read_jsonl
from tests.helpers.cli_runs import MODEL_CONFIG, gpuplan, start, state, tiny_spec, train_steps

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def _wait_for(predicate, proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"apply ended early (rc {proc.returncode}): {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.02)


def _complete_checkpoints(out) -> list[str]:
    try:
        return [p.name for p in out.glob("checkpoint-*") if checkpoint_problem(str(p)) is None]
    except OSError:  # rotated away while we looked
        return []


def _logged_steps(out) -> int:
    """Train lines written so far (the last one may be half-written while we read)."""
    try:
        return sum('"event": "train"' in line and line.endswith("}") for line in (out / "metrics.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def _all_json_parses(out) -> None:
    for path in out.rglob("*.json"):
        json.loads(path.read_text())
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)


def test_sigkill_at_a_random_moment_then_apply_resumes(tmp_path):
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out, max_steps=16, save_steps=2, keep=2)
    proc = start("apply", spec, "--yes")
    _wait_for(lambda: _complete_checkpoints(out), proc)
    delay = random.uniform(0.0, 0.3)
    time.sleep(delay)
    assert proc.poll() is None, f"the run finished within {delay:.2f}s: nothing was killed"
    proc.kill()  # SIGKILL: no handler, no cleanup
    proc.wait()
    assert state(out)["status"] == "running"  # what a kill leaves behind

    r = gpuplan("apply", spec, "--yes", "--break-lock")  # the dead apply's lock stays behind
    assert r.returncode == 0, f"killed after {delay:.2f}s: {r.stderr[-2000:]}"
    s = state(out)
    assert s["status"] == "completed" and s["resumed_from"] is not None, delay
    assert s["progress"] == {"global_step": 16, "max_steps": 16, "samples_seen": 64}, delay
    assert train_steps(out) == list(range(1, 17)), delay  # no step lost or logged twice
    _all_json_parses(out)
    assert all(checkpoint_problem(str(p)) is None for p in out.glob("checkpoint-*"))


def test_sigint_saves_a_checkpoint_and_says_how_to_resume(tmp_path):
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out, max_steps=12, save_steps=1000)
    proc = start("apply", spec, "--yes")
    _wait_for(lambda: _logged_steps(out) >= 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    s = state(out)
    step = s["progress"]["global_step"]
    assert s["status"] == "interrupted" and 3 <= step < 12
    assert f"Interrupted at step {step}; saved {out / f'checkpoint-{step}'}" in err
    assert f"Resume with: gpuplan apply {spec} --yes" in err
    assert checkpoint_problem(str(out / f"checkpoint-{step}")) is None
    assert not (out / ".gpuplan.lock").exists() and not (out / "final").exists()

    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr[-2000:]
    assert state(out)["progress"]["global_step"] == 12 and train_steps(out) == list(range(1, 13))


def _oom_plan(tmp_path, **extra):
    return cpu_plan(
        tmp_path,
        memory={"allocated_peak_bytes": 2 * 2**30, "capacity_bytes": 3 * 2**30},
        **{
            "training.max_steps": 6,
            "training.save_steps": 2,
            "training.save_total_limit": 3,
            "training.per_device_train_batch_size": 4,
            "training.gradient_accumulation_steps": 1,
            "training.effective_batch_size": 4,
            "data.seq_len": 32,
            **extra,
        },
    )


def test_out_of_memory_replans_to_a_smaller_batch_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPLAN_TEST_INJECT_OOM", "3:1")  # steps from 3 on fail above per-device batch 1
    lines: list[str] = []
    results = execute(_oom_plan(tmp_path), echo=lines.append, progress=False)
    out = str(tmp_path / "run")
    s = read_state(out)
    replans = s["oom_replans"]
    assert [(r["from"], r["to"]) for r in replans] == [
        ({"batch": 4, "accumulation": 1}, {"batch": 2, "accumulation": 2}),
        ({"batch": 2, "accumulation": 2}, {"batch": 1, "accumulation": 4}),
    ]
    assert all(r["step"] == 3 and r["resumed_from"] == os.path.join(out, "checkpoint-2") for r in replans)
    assert replans[0]["estimated_allocated_bytes"] == 2 * 2**30 and replans[0]["capacity_bytes"] == 3 * 2**30
    assert replans[0]["estimate_low_by_at_least"] == pytest.approx(0.5)
    assert "OutOfMemoryError" in replans[0]["error"]
    assert any("the estimate was at least 50% low" in line and "per-device batch 2 x 2" in line for line in lines)
    assert s["status"] == "completed" and s["progress"] == {"global_step": 6, "max_steps": 6, "samples_seen": 24}
    assert s["plan"]["settings"]["training.per_device_train_batch_size"]["value"] == 1
    assert s["plan"]["settings"]["training.gradient_accumulation_steps"]["value"] == 4
    assert results["per_device_train_batch_size"] == 1 and results["global_step"] == 6
    steps = [r["step"] for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if r["event"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_an_attempt_that_ran_out_of_memory_is_unreferenced_when_its_memory_is_released(tmp_path, monkeypatch):
    import weakref

    from gpuplan.apply.train import attempts
    from gpuplan.apply.train import execute as run

    real_build, real_release, models, released = run.build_trainer, attempts._release, [], []

    def build_and_watch(plan, **kw):
        prepared = real_build(plan, **kw)
        models.append(weakref.ref(prepared.model))
        return prepared

    def release_and_check(*args):
        real_release(*args)  # gc.collect(), and torch.cuda.empty_cache() on a GPU
        released.append([m() is None for m in models])

    # the real builder and releaser, watched
    monkeypatch.setattr(run, "build_trainer", build_and_watch)
    monkeypatch.setattr(attempts, "_release", release_and_check)  # the retry loop's (apply/train/attempts.py)
    monkeypatch.setenv("GPUPLAN_TEST_INJECT_OOM", "3:1")
    execute(_oom_plan(tmp_path), echo=lambda s: None, progress=False)
    assert len(models) == 3  # batch 4, 2, then 1
    assert released == [[True], [True, True]], "a model outlived the release of its memory"


def test_out_of_memory_at_batch_one_stops_instead_of_looping(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPLAN_TEST_INJECT_OOM", "0:0")  # every batch fails
    with pytest.raises(ApplyError, match=r"out of memory at step 0 at per-device batch 1 .*at least 50% low"):
        execute(_oom_plan(tmp_path), echo=lambda s: None, progress=False)
    s = read_state(str(tmp_path / "run"))
    assert s["status"] == "failed" and [r["to"]["batch"] for r in s["oom_replans"]] == [2, 1]


def test_incomplete_and_corrupt_checkpoints(tmp_path):
    from gpuplan.apply.launch.session import latest_checkpoint, set_aside_incomplete

    plan = cpu_plan(tmp_path, **{"training.max_steps": 4, "training.save_steps": 2, "training.save_total_limit": 3, "data.seq_len": 32})
    execute(plan, echo=lambda s: None, progress=False)
    out = tmp_path / "run"
    assert latest_checkpoint(str(out)) == str(out / "checkpoint-4")
    assert json.loads((out / "checkpoint-4" / MARKER).read_text())["step"] == 4

    (out / "checkpoint-4" / MARKER).unlink()  # as if killed while saving
    assert latest_checkpoint(str(out)) == str(out / "checkpoint-2")
    moved = set_aside_incomplete(str(out))
    assert len(moved) == 1 and os.path.basename(moved[0]).startswith("incomplete-checkpoint-4-")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]

    weights = out / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(PlanError) as e:
        latest_checkpoint(str(out))
    d = e.value.diagnostics[0]
    assert f"checkpoint {out / 'checkpoint-2'} is corrupt: model.safetensors is 100 bytes" in d.summary
    assert "--restart" in d.fix and f"delete {out / 'checkpoint-2'}" in d.fix
    with pytest.raises(ApplyError, match="corrupt: model.safetensors"):
        execute(plan, echo=lambda s: None, progress=False, resume_from=str(out / "checkpoint-2"))


def test_remote_code_needs_the_spec_and_the_flag(tmp_path):
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out, model_extra="trust_remote_code = true")
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1 and "apply needs --trust-remote-code too" in r.stderr
    assert not out.exists()


def _pickled_model_dir(tmp_path):
    """A model dir whose only weights are a pickle that would create a file if ever loaded."""
    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "pickle-ran"), "w"))

    d = tmp_path / "model"
    d.mkdir()
    shutil.copy(MODEL_CONFIG, d / "config.json")
    byte_level_tokenizer().save_pretrained(d)
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    return d


def test_pickle_weights_are_refused_without_allow_pickle_weights(tmp_path):
    model = _pickled_model_dir(tmp_path)
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out)
    text = spec.read_text().replace(f'config = "{MODEL_CONFIG}"\nfrom_scratch = true', f'name_or_path = "{model}"\nfrom_scratch = false')
    spec.write_text(text)
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1, r.stdout[-2000:]
    assert "pickle format (pytorch_model.bin)" in r.stderr and "model.allow_pickle_weights = true" in r.stderr
    assert not (tmp_path / "pickle-ran").exists()


def test_apply_writes_only_under_output_dir(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    out = tmp_path / "run"
    spec = tiny_spec(work / "tiny.toml", out, max_steps=2, save_steps=2)
    r = gpuplan(
        "apply",
        spec,
        "--yes",
        "--trust-remote-code",
        cwd=work,
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        HF_HOME=str(home / ".cache" / "huggingface"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(home.rglob("*")) == []  # no ~/.cache/huggingface/datasets, nothing
    assert sorted(os.listdir(work)) == ["tiny.toml"]  # nothing next to the spec or in the cwd
    assert sorted(os.listdir(tmp_path)) == ["home", "run", "work"]
    # the flag alone does not turn remote code on: the plan (from the spec) says false
    assert state(out)["plan"]["settings"]["model.trust_remote_code"]["value"] is False
