"""generate, eval and export on a real run: a tiny Llama trained by `gpuplan apply` on a fixed digit pattern.

One apply per module (30 steps, seconds on one core). Checked: generate continues the
pattern, [eval] sample_prompts reached metrics.jsonl, eval's perplexity is exp of the
eval loss apply logged at the same weights and lands in the state and `gpuplan show`,
and every refused input exits 1 with a message and leaves every file as it was.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil

import pytest

from tests.helpers.after_runs import PATTERN, pattern_spec, tree
from tests.helpers.apply_plans import read_jsonl
from tests.helpers.cli_runs import gpuplan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pattern")
    spec = pattern_spec(tmp)
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    return spec, tmp / "run"


def _ok(*args, **kw):
    r = gpuplan(*args, **kw)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_generate_continues_the_pattern(run):
    spec, out = run
    r = _ok("generate", spec, "--prompt", "3456", "--max-new-tokens", "12", "--json")
    g = json.loads(r.stdout)["generations"][0]
    assert g["text"] == "3456"  # a text run: the prompt as it is, no template
    assert g["completion"] == "789012345678"
    assert "loaded model " + str(out / "final") in r.stderr


def test_generate_reads_a_prompts_file_and_an_intermediate_checkpoint(run, tmp_path):
    spec, out = run
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"01234"\n{"prompt": "56789"}\n')
    r = _ok("generate", spec, "--prompts", prompts, "--checkpoint", "15", "--max-new-tokens", "5")
    assert "checkpoint at step 15" in r.stderr and str(out / "checkpoint-15") in r.stderr
    assert r.stdout.count("> ") == 2


def test_apply_generated_the_sample_prompts_into_metrics(run):
    _, out = run
    samples = [r for r in read_jsonl(out / "metrics.jsonl") if r["event"] == "sample"]
    assert [(s["step"], s["at"], s["prompt"]) for s in samples] == [(30, "end", "3456")]
    assert samples[0]["completion"] == (PATTERN * 3)[7:19]  # 12 tokens: "789012345678"


def test_eval_perplexity_is_exp_of_the_eval_loss_apply_logged(run):
    spec, out = run
    logged = [r for r in read_jsonl(out / "metrics.jsonl") if r["event"] == "eval"][-1]
    assert logged["step"] == 30  # the last eval ran on the final weights
    e = json.loads(_ok("eval", spec, "--json").stdout)
    assert e["eval_loss"] == pytest.approx(logged["eval_loss"], rel=1e-5)
    assert e["perplexity"] == pytest.approx(math.exp(logged["eval_loss"]), rel=1e-5)
    assert e["step"] == 30 and e["data"] == "the run's eval split" and e["eval_sequences"] > 0
    state = json.loads((out / "gpuplan-state.json").read_text())
    assert state["evaluations"][-1] == e
    show = _ok("show", out).stdout
    assert (
        f"eval at step 30 ({e['at']}, the run's eval split): held-out loss {e['eval_loss']:.4f}, perplexity {e['perplexity']:.4f}" in show
    )
    assert "sample at step 30: '3456' -> '789012345678'" in show


def test_eval_on_other_data(run, tmp_path):
    spec, _ = run
    other = tmp_path / "shifted.txt"
    other.write_text("\n".join("9876543210" * 3 for _ in range(40)) + "\n")  # the pattern backwards
    e = json.loads(_ok("eval", spec, "--data", other, "--json").stdout)
    own = json.loads(_ok("eval", spec, "--json").stdout)
    assert e["data"] == [str(other)] and e["eval_loss"] > own["eval_loss"] + 1.0


def test_export_of_a_full_run_reloads_with_transformers(run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    spec, out = run
    dest = tmp_path / "exported"
    r = _ok("export", spec, "--to", dest, "--context", "256")
    assert "vllm serve " + str(dest) + " --dtype float32 --max-model-len 256" in r.stdout
    assert "Inference memory for one sequence of 256 tokens in float32" in r.stdout
    assert {"model.safetensors", "config.json", "tokenizer.json", "gpuplan-export.json"} <= {p.name for p in dest.iterdir()}
    x = torch.tensor([[ord(c) for c in "0123456789012"]])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(dest)(x).logits
        b = AutoModelForCausalLM.from_pretrained(out / "final")(x).logits
    assert torch.equal(a, b)


def test_export_into_a_closed_pipe_exports_and_ends_quietly(run, tmp_path):
    """`gpuplan export SPEC --to DIR | head -1`: the model is written, the closed pipe says nothing (exit 141)."""
    from tests.cli.test_cli_pipes import run_into_closed_pipe

    spec, _ = run
    r = run_into_closed_pipe("export", spec, "--to", tmp_path / "exported", cwd=tmp_path)
    assert r.returncode == 141 and "internal error" not in r.stderr, r.stderr
    assert (tmp_path / "exported" / "model.safetensors").is_file()


def _refused(args, out, expect: str, capsys, *, also_absent=None):
    """The CLI in this process (a refusal loads no model): exit 1, the message, no file touched."""
    import os

    from gpuplan.cli.main import main

    before, env = tree(out), dict(os.environ)
    try:
        code = main([str(a) for a in args])
    finally:  # eval sets HF_*_OFFLINE for its process; keep them out of the other tests
        os.environ.clear()
        os.environ.update(env)
    err = capsys.readouterr().err
    assert code == 1, err
    assert expect in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert tree(out) == before  # nothing written, nothing touched
    if also_absent is not None:
        assert not also_absent.exists()


@pytest.mark.parametrize(
    "args,expect",
    [
        (("generate", "{spec}"), "give --prompt TEXT or --prompts FILE"),
        (("generate", "{spec}", "--prompt", "1", "--prompts", "{tmp}/p.txt"), "not both"),
        (("generate", "{spec}", "--prompts", "{tmp}/missing.txt"), "no such file"),
        (("generate", "{spec}", "--prompts", "{tmp}/bad.jsonl"), "holds no prompt text"),
        (("generate", "{spec}", "--prompt", "1", "--max-new-tokens", "0"), "--max-new-tokens 0 must be at least 1"),
        (("generate", "{spec}", "--prompt", "1", "--temperature", "-1"), "--temperature -1.0 must be 0"),
        (("generate", "{spec}", "--prompt", "1", "--checkpoint", "7"), "use one of the saved steps: 15, 30"),
        (("chat", "{spec}", "--checkpoint", "7"), "checkpoint-7 does not exist"),
        (("eval", "{spec}", "--data", "{tmp}/missing.jsonl"), "--data {tmp}/missing.jsonl: no such file"),
        (("eval", "{spec}", "--data", "{tmp}/p.docx"), "suffix '.docx' is not one of"),
        (("export", "{spec}", "--to", "{tmp}/full"), "already exists and is not an empty folder"),
        (("export", "{spec}", "--to", "{tmp}/no/such/dir"), "does not exist"),
        (("export", "{spec}", "--to", "{tmp}/new", "--context", "0"), "--context 0 must be a number of tokens"),
    ],
)
def test_bad_input_exits_1_and_writes_nothing(run, tmp_path, args, expect, capsys):
    spec, out = run
    (tmp_path / "p.txt").write_text("1\n")
    (tmp_path / "p.docx").write_text("1\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "1"}\n')
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    fill = {"spec": str(spec), "tmp": str(tmp_path)}
    _refused([a.format(**fill) for a in args], out, expect.format(**fill), capsys, also_absent=tmp_path / "new")
    assert (tmp_path / "full" / "x").read_text() == "keep"


def test_commands_refuse_a_spec_that_was_never_applied(run, tmp_path, capsys):
    spec, _ = run
    other = tmp_path / "other.toml"
    other.write_text(
        spec.read_text()
        .replace('dir = "run"', f'dir = "{tmp_path / "never"}"')
        .replace('"micro.json"', f'"{spec.parent / "micro.json"}"')
        .replace('"pattern.txt"', f'"{spec.parent / "pattern.txt"}"')
    )
    for args in (("generate", other, "--prompt", "1"), ("chat", other), ("eval", other), ("export", other, "--to", tmp_path / "e")):
        _refused(args, tmp_path, "no run here yet", capsys)
        _refused(args, tmp_path, f"gpuplan apply {other} --yes", capsys)
    assert not (tmp_path / "never").exists() and not (tmp_path / "e").exists()


def test_commands_refuse_an_unfinished_run(run, tmp_path, capsys):
    spec, out = run
    copy = tmp_path / "copy"
    shutil.copytree(spec.parent, copy, ignore=shutil.ignore_patterns("*.safetensors.tmp"))
    state = json.loads((copy / "run" / "gpuplan-state.json").read_text())
    state.update(status="interrupted", error="interrupted by the user at step 30")
    (copy / "run" / "gpuplan-state.json").write_text(json.dumps(state))
    _refused(
        ("generate", copy / "pattern.toml", "--prompt", "1"),
        copy / "run",
        "the last apply is interrupted (interrupted by the user at step 30)",
        capsys,
    )
    r = _ok("generate", copy / "pattern.toml", "--prompt", "3456", "--checkpoint", "15", "--max-new-tokens", "3")
    assert r.stdout.startswith("> 3456\n")


TASK = """\
task: {name}
dataset_path: {path}
{kwargs}test_split: test
output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
"""


def _task_spec(spec, tasks: list[str]):
    """A second spec for the same run, with [eval] tasks added after training (read from the spec as it is now)."""
    from tests.helpers.after_runs import PATTERN_SPEC

    extra = f'tasks = {json.dumps(tasks)}\ninclude_path = "tasks"\nlimit = 10\n'
    other = spec.parent / "pattern-tasks.toml"
    other.write_text(PATTERN_SPEC.format(eval_extra=extra))
    tasks_dir = spec.parent / "tasks"
    tasks_dir.mkdir(exist_ok=True)
    # "<eos>" is one token: every training row starts after it (packing, apply/data/prepare.py); lm-eval takes an
    # all-digit doc_to_text for an index into the choices, so the contexts are not all digits
    docs = [
        {"context": "<eos>0123", "choices": ["4", "7"], "label": 0},
        {"context": "<eos>012345", "choices": ["2", "6"], "label": 1},
        {"context": "<eos>01234567", "choices": ["8", "0"], "label": 0},
        {"context": "<eos>0123456789", "choices": ["3", "0"], "label": 1},
    ]
    (tasks_dir / "next.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    local = f"dataset_kwargs:\n  data_files:\n    test: {tasks_dir / 'next.jsonl'}\n"
    (tasks_dir / "next.yaml").write_text(TASK.format(name="digits_next", path="json", kwargs=local))
    (tasks_dir / "hub.yaml").write_text(TASK.format(name="hub_digits", path="someorg/digits", kwargs=""))
    return other


def test_eval_runs_a_local_lm_eval_task(run):
    # not importorskip: importing lm_eval sets HF_XET_HIGH_PERFORMANCE in this worker's environment
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm_eval is not installed (pip install lm-eval)")
    spec, out = run
    e = json.loads(_ok("eval", _task_spec(spec, ["digits_next"]), "--json").stdout)
    assert e["tasks"]["digits_next"]["acc"] == 1.0 and e["tasks"]["digits_next"]["examples"] == 4
    assert e["eval_loss"] > 0  # the held-out loss too
    assert "digits_next acc 1.0000" in _ok("show", out).stdout


@pytest.mark.parametrize(
    "task,expect",
    [
        ("hub_digits", "task 'hub_digits' needs the dataset 'someorg/digits', which is not available offline"),
        ("no_such_task", "'no_such_task' is no lm-eval task in "),
    ],
)
def test_eval_refuses_tasks_it_cannot_run_offline(run, task, expect):
    # not importorskip: importing lm_eval sets HF_XET_HIGH_PERFORMANCE in this worker's environment
    if importlib.util.find_spec("lm_eval") is None:
        pytest.skip("lm_eval is not installed (pip install lm-eval)")
    spec, out = run
    other = _task_spec(spec, [task])
    before = tree(out)
    r = gpuplan("eval", other)
    assert r.returncode == 1 and expect in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and tree(out) == before


def test_show_takes_the_spec_of_a_run_and_the_after_commands_take_its_dir(run):
    """show SPEC shows the spec's output.dir; generate/chat RUN_DIR use the spec the run's state records."""
    spec, out = run
    assert _ok("show", spec).stdout == _ok("show", out).stdout
    assert json.loads(_ok("show", spec, "--json").stdout) == json.loads(_ok("show", out, "--json").stdout)
    by_spec = json.loads(_ok("generate", spec, "--prompt", "3456", "--max-new-tokens", "6", "--json").stdout)
    by_dir = json.loads(_ok("generate", out, "--prompt", "3456", "--max-new-tokens", "6", "--json").stdout)
    assert by_dir == by_spec and by_dir["generations"][0]["completion"] == "789012"
    r = _ok("chat", out)  # stdin is no terminal and empty: loads the model, then ends
    assert "loaded model " + str(out / "final") in r.stderr


def test_a_copied_run_dir_uses_its_own_plan(run, tmp_path):
    """The recorded spec writes to the original dir, not to this copy: the copy's own state and weights are used."""
    spec, out = run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("*.safetensors.tmp"))
    r = _ok("generate", copy, "--prompt", "3456", "--max-new-tokens", "6", "--json")
    assert json.loads(r.stdout)["generations"][0]["completion"] == "789012"
    assert "loaded model " + str(copy / "final") in r.stderr


def test_show_and_the_after_commands_name_the_other_form(run, tmp_path, capsys):
    spec, out = run
    (tmp_path / "empty").mkdir()
    notes = tmp_path / "notes.txt"
    notes.write_text("not json\n")
    never = tmp_path / "never.toml"
    never.write_text(
        spec.read_text()
        .replace('dir = "run"', f'dir = "{tmp_path / "never"}"')
        .replace('"micro.json"', f'"{spec.parent / "micro.json"}"')
        .replace('"pattern.txt"', f'"{spec.parent / "pattern.txt"}"')
    )
    _refused(("show", notes), tmp_path, "give a run's output dir, its spec (.toml) or a saved plan", capsys)
    _refused(("show", never), tmp_path, f"nothing was applied from {never} yet", capsys)
    _refused(("show", never), tmp_path, f"run it: gpuplan apply {never}", capsys)
    for command in ("generate", "chat", "eval", "export"):
        extra = {"generate": ("--prompt", "1"), "export": ("--to", str(tmp_path / "e"))}.get(command, ())
        args = (command, tmp_path / "empty", *extra)
        _refused(args, tmp_path, "so not a run's output dir", capsys)
        _refused(args, tmp_path, f"give the spec (.toml) of the run, or its output.dir: gpuplan {command} SPEC.toml", capsys)
    assert not (tmp_path / "never").exists() and not (tmp_path / "e").exists()
