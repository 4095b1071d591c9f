"""`gpuplan init MODEL --data FILE` from a Hub id (a cache built here, in huggingface_hub's layout) and from a
local directory, then `plan` and `apply` with no edit; the screen holds only gpuplan's lines."""

from __future__ import annotations

import json
import re

import pytest
import tomllib

from gpuplan.render.notices import DEBUG_LOG, KNOWN
from tests.helpers.hub_cache import add_repo, chat_rows, run_cli, tiny_model_files, worker_cache

# What a library prints when it reaches the terminal itself: the KNOWN notices, Python's
# warning format ("file.py:12: FutureWarning: ..." and the source line after it),
# transformers' "[transformers]" log prefix and loading report, tqdm's bars.
FOREIGN = [k.pattern for k in KNOWN] + [
    r"\.py:\d+: \w*Warning",
    r"^\s*warnings\.warn\(",
    r"\[transformers\]",
    r"LOAD REPORT",
    r"\d+it/s\]",
    r"it/s\]$",
]


def foreign_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if any(re.search(p, ln) for p in FOREIGN)]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("inithub")
    cache = worker_cache()  # the worker's own: its fork server serves every command of this file
    files = tiny_model_files(root)
    commit = add_repo(cache, "acme/micro-llama", files)
    data_commit = add_repo(cache, "acme/chat", {"data/train.jsonl": chat_rows(), "README.md": b"# chat\n"}, repo_type="dataset")
    return {"root": root, "cache": cache, "files": files, "commit": commit, "data_commit": data_commit}


def test_init_from_a_hub_id_resolves_config_from_the_cache_and_plans(hub, tmp_path):
    (tmp_path / "chat.jsonl").write_bytes(chat_rows())
    out = tmp_path / "micro.toml"
    r = run_cli(
        ["init", "acme/micro-llama", "--gpu", "cpu", "--data", str(tmp_path / "chat.jsonl"), "--out", str(out)], hub["cache"], cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    raw = tomllib.loads(out.read_text())
    assert raw["model"]["name_or_path"] == "acme/micro-llama" and "config" not in raw["model"]
    assert raw["model"]["method"] == "full"
    assert raw["data"]["train_files"] == ["chat.jsonl"] and raw["data"]["format"] == "chat"
    # the cached tokenizer (byte-level) has no chat template: init writes ChatML and says why
    assert raw["data"]["chat_template"] == "chatml"
    assert "has no chat template" in out.read_text()
    assert "Plan: " in r.stdout and "Next: gpuplan plan" in r.stdout
    r = run_cli(["plan", str(out), "--json"], hub["cache"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["model.commit"]["value"] == hub["commit"]


def test_init_hub_errors_are_the_plans_errors(hub, tmp_path):
    r = run_cli(["init", "acme/absent", "--gpu", "cpu", "--out", str(tmp_path / "x.toml")], hub["cache"], cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "hf download acme/absent config.json --revision main" in r.stderr and str(hub["cache"]) in r.stderr
    assert not (tmp_path / "x.toml").exists()
    spec = tmp_path / "absent.toml"
    spec.write_text('[model]\nname_or_path = "acme/absent"\n[hardware]\ngpu = "cpu"\n')
    plan = run_cli(["plan", str(spec)], hub["cache"], cwd=tmp_path)
    assert plan.returncode == 1
    first = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert first and first[0] in plan.stderr.splitlines()  # the same error line, word for word


@pytest.mark.slow  # trains: init -> plan -> apply
def test_init_plan_apply_with_no_edit_from_a_hub_model_and_a_hub_dataset(hub, tmp_path):
    out = tmp_path / "ds.toml"
    r = run_cli(["init", "acme/micro-llama", "--gpu", "cpu", "--data", "acme/chat", "--out", str(out)], hub["cache"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    raw = tomllib.loads(out.read_text())
    assert raw["data"]["dataset"] == "acme/chat" and "train_files" not in raw["data"]
    assert raw["data"]["format"] == "chat"
    assert run_cli(["plan", str(out)], hub["cache"], cwd=tmp_path).returncode == 0
    before = out.read_text()
    applied = run_cli(["apply", str(out), "--yes"], hub["cache"], timeout=600, cwd=tmp_path)  # offline, from the cache
    assert applied.returncode == 0, applied.stderr
    assert out.read_text() == before
    assert (tmp_path / "runs" / "micro-llama" / "final" / "model.safetensors").is_file()
    assert foreign_lines(applied.stdout + applied.stderr) == []


@pytest.mark.slow  # trains: init -> plan -> apply
def test_init_plan_data_apply_with_no_edit_from_a_local_directory_and_only_gpuplan_on_screen(hub, tmp_path):
    """The micro Llama saved to a directory, a chat file, --method lora: init, plan, apply as written.
    peft 0.21 reads transformers' deprecated is_gradient_checkpointing in get_peft_model: the
    FutureWarning goes to the debug log, not the screen."""
    model = tmp_path / "micro"
    model.mkdir()
    for name, content in hub["files"].items():
        (model / name).write_bytes(content)
    (tmp_path / "chat.jsonl").write_bytes(chat_rows())
    spec = tmp_path / "gpuplan.toml"
    r = run_cli(
        ["init", str(model), "--gpu", "cpu", "--method", "lora", "--data", str(tmp_path / "chat.jsonl"), "--out", str(spec)],
        hub["cache"],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    raw = tomllib.loads(spec.read_text())
    assert raw["model"]["name_or_path"] == "micro" and raw["model"]["method"] == "lora"
    assert "Set by init --method lora; it fits on cpu." in spec.read_text()
    before = spec.read_text()
    plan = run_cli(["plan", str(spec)], hub["cache"], cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    data = run_cli(["data", str(spec), "--examples", "1"], hub["cache"], cwd=tmp_path)
    assert data.returncode == 0, data.stderr
    assert "1 example(s) of chat data" in data.stdout
    applied = run_cli(["apply", str(spec), "--yes"], hub["cache"], timeout=600, cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert spec.read_text() == before  # nothing edited between the three commands
    run_dir = tmp_path / "runs" / "micro"
    assert (run_dir / "final" / "adapter_model.safetensors").is_file()
    screen = "".join(x.stdout + x.stderr for x in (r, plan, data, applied))
    assert foreign_lines(screen) == []
    log = (run_dir / DEBUG_LOG).read_text()
    assert "`is_gradient_checkpointing` is deprecated" in log
