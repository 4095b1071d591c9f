"""`gpuplan init` and `gpuplan fmt` as a user runs them: a real subprocess, files, exit codes."""

import json
import re
import sys

import tomllib

from tests.helpers.cli_runs import run
from tests.helpers.planning import MODELS


def gpuplan(*args, cwd=None, stdin=None):
    return run([sys.executable, "-m", "gpuplan.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd, input=stdin, timeout=120)


def test_init_writes_a_spec_that_plans_then_refuses_to_overwrite(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt2.json").write_text((MODELS / "gpt2.json").read_text())
    r = gpuplan("init", "models/gpt2.json", "--gpu", "t4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    spec = tmp_path / "gpuplan.toml"
    assert "gpuplan plan gpuplan.toml" in r.stdout
    raw = tomllib.loads(spec.read_text())
    assert raw["hardware"]["gpu"] == "T4"
    assert raw["model"]["config"] == "models/gpt2.json"  # relative to the spec: plans from anywhere
    r = gpuplan("plan", spec, "--no-color", cwd="/")
    assert r.returncode == 0, r.stderr
    assert "Plan: " in r.stdout

    before = spec.read_text()
    r = gpuplan("init", MODELS / "opt-125m.json", cwd=tmp_path)
    assert r.returncode == 1
    assert "already exists" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    assert spec.read_text() == before
    r = gpuplan("init", MODELS / "opt-125m.json", "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert tomllib.loads(spec.read_text())["hardware"]["gpu"] == "auto"  # --gpu defaults to auto
    assert not list(tmp_path.glob(".*tmp*"))  # the atomic write left no temporary file


def test_init_out_task_and_errors(tmp_path):
    out = tmp_path / "specs" / "cls.toml"
    out.parent.mkdir()
    r = gpuplan("init", MODELS / "bert-base-uncased.json", "--gpu", "A10G", "--task", "seq-cls", "--out", out)
    assert r.returncode == 0, r.stderr
    raw = tomllib.loads(out.read_text())
    assert raw["model"]["task"] == "seq-cls"
    assert (out.parent / raw["model"]["config"]).resolve() == (MODELS / "bert-base-uncased.json").resolve()
    r = gpuplan("init", MODELS / "gpt2.json", "--gpu", "H1000", "--out", tmp_path / "x.toml")
    assert r.returncode == 1
    assert "unknown GPU 'H1000'" in r.stderr and "Did you mean" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.toml").exists()
    r = gpuplan("init", tmp_path / "none.json", "--out", tmp_path / "y.toml")
    assert r.returncode == 1 and "file not found" in r.stderr


def test_fmt_check_rewrite_and_stdin(tmp_path):
    messy = tmp_path / "messy.toml"
    messy.write_text('[training]\nseed=1\n# the model\n[model]\nconfig = "c"\n')
    tidy = tmp_path / "tidy.toml"
    tidy.write_text('[model]\nconfig = "c"\n')
    r = gpuplan("fmt", "--check", messy, tidy)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [str(messy)]
    assert messy.read_text().startswith("[training]")  # --check writes nothing

    r = gpuplan("fmt", messy, tidy)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(messy)]
    assert messy.read_text() == '# the model\n[model]\nconfig = "c"\n\n[training]\nseed = 1\n'
    assert gpuplan("fmt", "--check", messy, tidy).returncode == 0

    r = gpuplan("fmt", "-", stdin='[output]\ndir="d"\n[model]\nconfig="c"\n')
    assert r.returncode == 0 and r.stdout == '[model]\nconfig = "c"\n\n[output]\ndir = "d"\n'
    r = gpuplan("fmt", "--check", "-", stdin='[model]\nconfig = "c"\n')
    assert r.returncode == 0 and r.stdout == ""


def test_fmt_invalid_toml_reports_file_line_col_and_formats_the_rest(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nconfig = \n")
    ok = tmp_path / "ok.toml"
    ok.write_text('[training]\nseed = 1\n[model]\nconfig = "c"\n')
    r = gpuplan("fmt", bad, ok)
    assert r.returncode == 1
    assert f"{bad}:2:" in r.stderr and "invalid TOML" in r.stderr and "Traceback" not in r.stderr
    assert ok.read_text().startswith("[model]")
    assert bad.read_text() == "[model]\nconfig = \n"
    r = gpuplan("fmt", "-", stdin="[model\n")
    assert r.returncode == 1 and "<stdin>:1:" in r.stderr


def test_init_8b_on_a_4090_with_chat_data_chooses_the_method_that_fits_and_says_why(tmp_path):
    """The newcomer's first goal: Llama-3.1-8B on an RTX-4090 with their own chat file. A full
    fine-tune needs 36 GiB: the planner picks lora (and gradient checkpointing); the spec says
    why above each line, and `gpuplan plan` of it exits 0 with no edit."""
    data = tmp_path / "chat.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}) + "\n"
            for i in range(5)
        )
    )
    out = tmp_path / "llama.toml"
    r = gpuplan("init", MODELS / "llama-3.1-8b.json", "--gpu", "RTX-4090", "--data", data, "--out", out)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    raw = tomllib.loads(text)
    assert raw["model"]["method"] == "lora"
    assert raw["training"]["gradient_checkpointing"] is True
    assert raw["data"]["format"] == "chat" and raw["data"]["train_files"] == ["chat.jsonl"]
    lines = text.splitlines()
    above = lines[lines.index(next(ln for ln in lines if ln.startswith("method = "))) - 2 :][:2]
    assert "Chosen by the plan on RTX-4090" in above[0] and "full does not fit" in " ".join(above)
    assert 'model.method = "lora": full does not fit' in r.stdout
    assert re.search(r"^Plan: \d+ to add, 0 to change\. .* of 24\.0 GiB$", r.stdout, re.M)
    plan = gpuplan("plan", out, "--no-color")
    assert plan.returncode == 0, plan.stderr
    assert "does not fit" not in plan.stdout + plan.stderr
    assert re.search(r"^Plan: .*$", r.stdout, re.M).group(0) in plan.stdout  # init printed the plan's own summary
    assert gpuplan("fmt", "--check", out).returncode == 0  # the notes above keys are fmt's layout already


def test_init_method_full_that_does_not_fit_writes_nothing_and_names_the_fix(tmp_path):
    out = tmp_path / "full.toml"
    r = gpuplan("init", MODELS / "llama-3.1-8b.json", "--gpu", "RTX-4090", "--method", "full", "--out", out)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "does not fit" in r.stderr and "--method auto" in r.stderr and "nothing was written" in r.stderr
    assert not out.exists()


def test_init_when_no_method_fits_names_a_gpu_that_does_and_that_fix_works(tmp_path):
    out = tmp_path / "70b.toml"
    r = gpuplan("init", MODELS / "llama-3.1-70b.json", "--gpu", "RTX-4090", "--out", out)
    assert r.returncode == 1 and "Traceback" not in r.stderr and not out.exists()
    assert "qlora does not fit" in r.stderr and "(full, lora and qlora tried): nothing was written" in r.stderr
    gpu = re.search(r"fix: run init again with --gpu (\S+)", r.stderr).group(1)
    r = gpuplan("init", MODELS / "llama-3.1-70b.json", "--gpu", gpu, "--out", out)
    assert r.returncode == 0, r.stderr
    assert tomllib.loads(out.read_text())["model"]["method"] == "qlora"
    assert gpuplan("plan", out).returncode == 0


def test_init_recognises_preference_pairs_and_says_what_the_spec_does_with_them(tmp_path):
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "chosen": "good", "rejected": "bad"}) + "\n" for i in range(3)))
    out = tmp_path / "prefs.toml"
    r = gpuplan("init", MODELS / "gpt2.json", "--gpu", "T4", "--data", data, "--out", out)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    comments = " ".join(ln[2:] for ln in text.splitlines() if ln.startswith("# "))  # notes wrap at 100 columns
    assert "Read from the rows: preference pairs (prompt, chosen, rejected)" in comments
    raw = tomllib.loads(text)
    assert raw["training"]["objective"] == "dpo" and "trained with DPO" in comments
    assert raw["training"]["learning_rate"] == 1e-6 and "TRL's default for dpo (DPOConfig), not SFT's 5e-5." in comments
    assert gpuplan("plan", out).returncode == 0


def test_init_objective_option_is_written_and_the_spec_plans(tmp_path):
    data = tmp_path / "kto.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "completion": "good" if i % 2 else "bad", "label": bool(i % 2)}) + "\n" for i in range(4))
    )
    out = tmp_path / "kto.toml"
    r = gpuplan("init", MODELS / "gpt2.json", "--gpu", "T4", "--data", data, "--objective", "kto", "--out", out)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert tomllib.loads(text)["training"]["objective"] == "kto"
    assert "# Set by init --objective kto." in text
    assert tomllib.loads(text)["training"]["learning_rate"] == 1e-6
    r = gpuplan("init", MODELS / "gpt2.json", "--gpu", "T4", "--objective", "orpo", "--out", tmp_path / "x.toml")
    assert r.returncode != 0 and "invalid choice" in r.stderr and not (tmp_path / "x.toml").exists()


def test_init_objective_kto_accepts_preference_pairs_and_the_spec_plans(tmp_path):
    """Issue 30: TRL's KTOTrainer unpairs prompt / chosen / rejected rows itself (trl/trainer/kto_trainer.py
    _prepare_dataset, trl/data_utils.py unpair_preference_dataset); init --objective kto refused them
    ("has no completion / label"). Now it writes a spec that plans and says the pairs train unpaired."""
    from tests.helpers.planning import SPECS

    data = SPECS / "data" / "preference-pairs.jsonl"
    out = tmp_path / "kto.toml"
    r = gpuplan("init", MODELS / "tiny-llama-cpu.json", "--gpu", "cpu", "--data", data, "--objective", "kto", "--out", out)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    comments = " ".join(ln[2:] for ln in text.splitlines() if ln.startswith("# "))
    assert tomllib.loads(text)["training"]["objective"] == "kto"
    assert "KTO trains on them unpaired" in comments
    r = gpuplan("plan", out, "--no-color")
    assert r.returncode == 0, r.stderr
    rows = sum(1 for line in data.read_text().splitlines() if line.strip())
    assert f"{rows} rows in {data} are prompt / chosen / rejected pairs" in " ".join(r.stdout.split())
    assert f"{2 * rows} labelled completions" in " ".join(r.stdout.split())
