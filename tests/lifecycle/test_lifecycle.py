"""The lifecycle through the real CLI: stale saved plans, --detailed-exitcode, resume,
--restart, the run lock and `gpuplan show` (subprocesses on tiny CPU specs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli_runs import CORPUS, gpuplan, state, tiny_spec, train_steps

pytestmark = pytest.mark.slow


def test_a_saved_plan_is_refused_once_stale_and_says_why(tmp_path):
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out)
    saved = tmp_path / "run.plan.json"
    r = gpuplan("plan", spec, "--out", saved)
    assert r.returncode == 0, r.stderr
    original_spec, original_plan = spec.read_text(), saved.read_text()

    spec.write_text(original_spec.replace("learning_rate = 3e-3", "learning_rate = 1e-3"))
    r = gpuplan("apply", saved, "--yes")
    assert r.returncode == 1
    assert f"stale plan: the spec {spec} was edited since the plan was made" in r.stderr
    assert f"gpuplan plan {spec} --out" in r.stderr  # the way forward
    spec.write_text(original_spec)

    edited = json.loads(original_plan)
    edited["settings"]["training.learning_rate"]["value"] = 1.0
    saved.write_text(json.dumps(edited))
    r = gpuplan("apply", saved, "--yes")
    assert r.returncode == 1 and "the plan's settings were edited after it was made" in r.stderr

    edited = json.loads(original_plan)
    edited["fingerprint"]["versions"]["torch"] = "1.0.0"
    saved.write_text(json.dumps(edited))
    r = gpuplan("apply", saved, "--yes")
    assert r.returncode == 1 and "torch 1.0.0 when planned" in r.stderr
    assert not out.exists()  # refused before anything was written

    # show of a saved plan, text and JSON
    saved.write_text(original_plan)
    r = gpuplan("show", saved)
    assert r.returncode == 0 and f"gpuplan plan: {spec}" in r.stdout and "allocated peak" in r.stdout
    assert "+ training.per_device_train_batch_size = 4" in r.stdout
    r = gpuplan("show", saved, "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == json.loads(original_plan)


def test_exit_codes_resume_and_restart(tmp_path):
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out, max_steps=4, save_steps=2)
    assert gpuplan("plan", spec, "--detailed-exitcode").returncode == 2  # never applied: all new
    saved = tmp_path / "run.plan.json"
    assert gpuplan("plan", spec, "--out", saved).returncode == 0
    r = gpuplan("apply", saved, "--yes")
    assert r.returncode == 0, r.stderr
    assert "new run" in r.stdout and state(out)["status"] == "completed"

    r = gpuplan("plan", spec, "--detailed-exitcode")
    assert r.returncode == 0 and "no changes." in r.stdout

    spec.write_text(spec.read_text().replace("max_steps = 4", "max_steps = 8"))
    r = gpuplan("plan", spec, "--detailed-exitcode")
    assert r.returncode == 2 and "~ training.max_steps = 4 -> 8" in r.stdout
    r = gpuplan("plan", spec, "--detailed-exitcode", "--json")
    assert r.returncode == 2
    assert {"key": "training.max_steps", "before": 4, "after": 8} in json.loads(r.stdout)["since_last_apply"]["changes"]

    # more steps: resume from the latest checkpoint, the metrics continue
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    assert f"resuming the completed run from {out / 'checkpoint-4'}" in r.stdout
    s = state(out)
    assert s["status"] == "completed" and s["resumed_from"] == str(out / "checkpoint-4")
    assert s["progress"] == {"global_step": 8, "max_steps": 8, "samples_seen": 32}
    assert s["results"]["start_step"] == 4
    assert train_steps(out) == [1, 2, 3, 4, 5, 6, 7, 8]

    # show of the run dir, text and JSON
    r = gpuplan("show", out)
    assert r.returncode == 0 and f"Run in {out}: completed" in r.stdout and "step 8 of 8, 32 samples seen" in r.stdout
    r = gpuplan("show", out, "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == s

    # a change that breaks the run: refused with the reason, unless --restart
    spec.write_text(spec.read_text().replace("seq_len = 32", "seq_len = 64"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1
    assert "data.seq_len: 32 -> 64 changes the sequence length" in r.stderr and "--restart" in r.stderr
    spec.write_text(spec.read_text().replace("learning_rate = 3e-3", "learning_rate = 1e-3"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1 and "training.learning_rate" in r.stderr and "data.seq_len" in r.stderr
    before = sorted(p.name for p in out.glob("checkpoint-*"))
    r = gpuplan("apply", spec, "--yes", "--restart")
    assert r.returncode == 0, r.stderr
    aside = list(out.glob("superseded-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == before
    s = state(out)
    assert s["resumed_from"] is None and s["progress"]["global_step"] == 8 and s["results"]["start_step"] == 0
    assert s["plan"]["settings"]["data.seq_len"]["value"] == 64


def _files(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under a run's output dir: (mtime in ns, bytes)."""
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out.rglob("*")) if p.is_file()}


def test_an_apply_with_no_changes_changes_nothing(tmp_path):
    """Terraform's rule: re-applying a completed run's unchanged spec trains no step, writes no
    file (final/, checkpoints, state with its evaluations, metrics, calibration) and says so, exit 0.
    A longer max_steps still resumes: test_exit_codes_resume_and_restart."""
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out, max_steps=2, save_steps=2)
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(CORPUS.read_text().splitlines()[:4]) + "\n")
    r = gpuplan("eval", spec, "--data", heldout)
    assert r.returncode == 0, r.stderr
    assert state(out)["evaluations"]
    calibration = Path(os.environ["GPUPLAN_CALIBRATION_FILE"])
    before, measured = _files(out), calibration.read_bytes()

    r = gpuplan("apply", spec)  # no --yes and no terminal: nothing to train, so nothing to confirm
    assert r.returncode == 0, r.stderr
    assert f"No changes: the run in {out} completed step 2 with this same plan." in r.stdout
    assert "Apply complete: nothing trained, nothing written." in r.stdout
    assert (
        f"raise training.max_steps above 2 (or training.num_train_epochs) and apply again: it resumes from {out / 'checkpoint-2'}"
        in r.stdout
    )
    assert "another output.dir, or apply with --restart" in r.stdout
    assert "resuming" not in r.stdout and "step 3" not in r.stdout
    assert _files(out) == before  # final/, checkpoint-2, the state (evaluations too), metrics: untouched
    assert calibration.read_bytes() == measured  # no calibration from a run that did not run

    # a change that asks for no more steps: nothing trained either, and the change is named
    spec.write_text(spec.read_text().replace("logging_steps = 1", "logging_steps = 2"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    assert (
        f"No steps to train: the run in {out} completed step 2 and this plan trains to step 2; "
        "what changed (training.logging_steps) takes effect only in a new run." in r.stdout
    )
    assert _files(out) == before


def test_a_resume_explains_the_library_notices_it_causes(tmp_path):
    """A resume of a model with tied embeddings ("missing keys ... ['lm_head.weight']"): explained in
    gpuplan's words in the debug log, not counted as unexplained, and the resumed run does not claim
    random weights. (The "mtime" notice: tests/apply/test_notices.py.)"""
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out, max_steps=2, save_steps=1)
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    assert "initialised at random" in r.stdout
    spec.write_text(spec.read_text().replace("max_steps = 2", "max_steps = 3"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    assert "does not explain" not in r.stderr
    assert "initialised at random" not in r.stdout and "its weights from the checkpoint it resumes from" in r.stdout
    log = (out / "gpuplan-debug.log").read_text()
    assert "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" in log
    assert "gpuplan: tied embeddings: lm_head.weight is tied to model.embed_tokens.weight" in log
    assert "nothing is missing" in log


def test_a_gpu_plan_applied_on_a_cpu_leaves_nothing_behind(tmp_path):
    """Refused before the run starts: no output dir, no gpuplan-debug.log in it (library notices are
    logged to output.dir only once the run starts), no state; the error says why."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    out = tmp_path / "run"
    spec = tiny_spec(tmp_path / "tiny.toml", out)
    spec.write_text(spec.read_text().replace('gpu = "cpu"', 'gpu = "A100-80GB"'))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1
    assert "the plan is for 'A100-80GB' but this process sees no CUDA device" in r.stderr
    assert not out.exists()


def test_the_run_lock_names_its_holder_and_breaks_only_when_dead(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # parquet data without the text field (plan reads the first rows of .jsonl / .json / .csv files
    # only, spec/data_fields.py; apply reads the parquet's columns): an apply that gets past
    # the lock fails at once, before training
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = tiny_spec(tmp_path / "tiny.toml", out)
    pq.write_table(pa.table({"body": ["no text field"]}), tmp_path / "none.parquet")
    spec.write_text(spec.read_text().replace(str(tiny_spec.__globals__["CORPUS"]), str(tmp_path / "none.parquet")))
    host, since = socket.gethostname(), "2026-01-02T03:04:05+00:00"
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (out / ".gpuplan.lock").write_text(json.dumps({"pid": holder.pid, "host": host, "since": since}))
        r = gpuplan("apply", spec, "--yes", "--break-lock")
        assert r.returncode == 1
        assert f"is in use by another apply: pid {holder.pid} on {host} since {since}" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: refused with the hint, then taken over with --break-lock
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1
    assert f"pid {holder.pid} on {host} since {since}, which is no longer running" in r.stderr
    assert "rerun with --break-lock" in r.stderr
    r = gpuplan("apply", spec, "--yes", "--break-lock")
    assert r.returncode == 1 and "data.text_field = 'text': no such field" in r.stderr  # past the lock, into the run
    assert not (out / ".gpuplan.lock").exists()  # released on the way out
    assert state(out)["status"] == "failed"


def test_corrupt_state_is_reported_with_a_way_forward(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "gpuplan-state.json").write_text('{"plan": {"settings"')
    spec = tiny_spec(tmp_path / "tiny.toml", out)
    for args in (("apply", spec, "--yes"), ("plan", spec), ("show", out)):
        r = gpuplan(*args)
        assert r.returncode == 1, args
        assert f"{out / 'gpuplan-state.json'} is corrupt" in r.stderr and "move" in r.stderr, args
    assert not (out / ".gpuplan.lock").exists()
    assert sorted(os.listdir(out)) == ["gpuplan-state.json"]
