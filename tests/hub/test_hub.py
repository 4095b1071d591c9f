"""Hub ids from a cache laid out as huggingface_hub lays it out: plan, lock, a moved refs/main, apply offline."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys

import pytest

from gpuplan.lifecycle.drift import resume_conflicts
from tests.helpers.hub_cache import REPO, add_repo, chat_rows, run_cli, tiny_model_files, worker_cache

SPEC = """\
[model]
name_or_path = "acme/micro-llama"
task = "causal-lm"

[hardware]
gpu = "cpu"

[data]
dataset = "acme/chat"
format = "chat"
chat_template = "chatml"
seq_len = 128

[training]
effective_batch_size = 4
learning_rate = 1e-2
max_steps = 2
logging_steps = 1
save_steps = 100
seed = 0

[output]
dir = "{out}"
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    cache = worker_cache()  # the worker's own: its fork server serves every command of this file
    files = tiny_model_files(root)
    commit = add_repo(cache, "acme/micro-llama", files)
    data_commit = add_repo(cache, "acme/chat", {"data/train.jsonl": chat_rows(), "README.md": b"# chat\n"}, repo_type="dataset")
    return {"root": root, "cache": cache, "files": files, "commit": commit, "data_commit": data_commit}


def _spec(tmp_path, text=SPEC):
    path = tmp_path / "hubspec.toml"
    path.write_text(text.format(out=tmp_path / "run"))
    return path


def test_plan_resolves_hub_ids_from_the_cache_without_torch(hub, tmp_path):
    probe = (
        "import sys; from gpuplan.cli import main; rc = main(['plan', sys.argv[1], '--json']);"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'datasets'));"
        "print('HEAVY:', heavy, file=sys.stderr); sys.exit(rc)"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hub["cache"]), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", probe, str(_spec(tmp_path))], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "HEAVY: []" in r.stderr
    plan = json.loads(r.stdout)
    assert plan["settings"]["model.commit"]["value"] == hub["commit"]
    assert plan["settings"]["data.commit"]["value"] == hub["data_commit"]
    assert plan["settings"]["model.name_or_path"]["value"] == "acme/micro-llama"
    assert any("not pinned" in d["summary"] for d in plan["diagnostics"])


def test_missing_repo_names_id_revision_cache_and_fetch_command(hub, tmp_path):
    r = run_cli(["plan", str(_spec(tmp_path, SPEC.replace("acme/micro-llama", "acme/absent")))], hub["cache"], cwd=tmp_path)
    assert r.returncode == 1
    assert "acme/absent" in r.stderr and "'main'" in r.stderr and str(hub["cache"]) in r.stderr
    assert "hf download acme/absent config.json --revision main" in r.stderr
    assert "Traceback" not in r.stderr


def test_lock_pins_commit_and_file_hashes_and_a_moved_ref_is_reported(hub, tmp_path):
    spec = _spec(tmp_path)
    r = run_cli(["lock", str(spec)], hub["cache"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lock = json.loads((tmp_path / "hubspec.lock.json").read_text())["repos"]
    model = lock["model.name_or_path"]
    assert model["commit"] == hub["commit"] and model["revision"] == "main"
    assert model["files"]["model.safetensors"] == hashlib.sha256(hub["files"]["model.safetensors"]).hexdigest()
    assert set(model["files"]) >= {"config.json", "tokenizer.json"}
    assert lock["data.dataset"]["files"]["data/train.jsonl"] == hashlib.sha256(chat_rows()).hexdigest()

    # refs/main moves to a new commit (a new upload of the model)
    moved = add_repo(hub["cache"], "acme/micro-llama", {**hub["files"], "README.md": b"v2\n"})
    try:
        r = run_cli(["plan", str(spec), "--json"], hub["cache"], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert plan["settings"]["model.commit"]["value"] == hub["commit"]  # the lock wins
        warn = [d for d in plan["diagnostics"] if d["key"] == "model.commit" and d["severity"] == "warning"]
        assert warn and moved[:12] in warn[0]["summary"] and "--upgrade" in warn[0]["fix"]

        r = run_cli(["lock", str(spec), "--upgrade"], hub["cache"], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        lock = json.loads((tmp_path / "hubspec.lock.json").read_text())["repos"]
        assert lock["model.name_or_path"]["commit"] == moved
        r = run_cli(["plan", str(spec), "--json"], hub["cache"], cwd=tmp_path)
        assert json.loads(r.stdout)["settings"]["model.commit"]["value"] == moved
    finally:
        add_repo(hub["cache"], "acme/micro-llama", hub["files"])  # refs/main back to the first commit


def test_changed_commit_breaks_resume():
    from gpuplan.plan.build import plan_file
    from gpuplan.plan.types import Setting
    from tests.helpers.planning import ENV, SPECS

    plan = plan_file(SPECS / "tiny.toml", environment=ENV)
    old, new = (dataclasses.replace(plan, settings={**plan.settings, "model.commit": Setting(c * 40, "derived")}) for c in "ab")
    assert resume_conflicts(old, new) == [f"model.commit: {'a' * 40!r} -> {'b' * 40!r} changes the model (its Hub commit)"]


@pytest.mark.slow
def test_apply_offline_fine_tunes_the_hub_model_on_the_hub_dataset(hub, tmp_path):
    spec = _spec(tmp_path)
    r = run_cli(["apply", str(spec), "--yes"], hub["cache"], timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    state = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())
    assert state["plan"]["settings"]["model.commit"]["value"] == hub["commit"]
    assert state["plan"]["settings"]["data.commit"]["value"] == hub["data_commit"]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("name", "status", "expected"),
    [
        ("GatedRepoError", 403, "is gated: accept its terms on https://huggingface.co/acme/x and log in with `hf auth login`"),
        ("RepositoryNotFoundError", 401, "no such repository, or it is private and your token cannot see it"),
        ("RevisionNotFoundError", 404, "no such branch, tag or commit"),
        ("HfHubHTTPError", 401, "the Hub refused access (HTTP 401); log in with `hf auth login` or set HF_TOKEN"),
    ],
)
def test_hub_failures_become_messages_that_say_what_to_do(name, status, expected):
    import httpx2  # huggingface_hub 2.x's HTTP client: its errors carry a real response
    from huggingface_hub import errors

    from gpuplan.hub.resolve import _translate

    response = httpx2.Response(status, request=httpx2.Request("HEAD", "https://huggingface.co/acme/x/resolve/main/config.json"))
    err = _translate(getattr(errors, name)("refused", response=response), "model.name_or_path", "acme/x", "model", "main", ("config.json",))
    assert err.message.startswith("model.name_or_path: model 'acme/x' at revision 'main'")
    assert expected in err.message


@pytest.mark.parametrize("repo_id", ["\u00b9", "caf\u00e9/model", "org/na--me"])
def test_a_name_huggingface_hub_refuses_as_a_repo_id_is_no_hub_id_and_a_spec_error_if_one_gets_through(repo_id):
    # huggingface_hub.utils._validators REPO_ID_REGEX is ASCII: "\u00b9" matches a unicode \w, not theirs
    from gpuplan.hub.ids import looks_like_repo_id
    from gpuplan.hub.resolve import HubError, download_file

    assert not looks_like_repo_id(repo_id)
    with pytest.raises(HubError) as e:  # not huggingface_hub's HFValidationError from try_to_load_from_cache
        download_file("model.name_or_path", repo_id, "model", "main", "config.json")
    (d,) = e.value.diagnostics
    assert d.key == "model.name_or_path" and f"{repo_id!r} is not a Hub repo id" in d.summary


DATASET_SPEC = """\
[model]
config = "{config}"
from_scratch = true

[hardware]
gpu = "cpu"

[data]
dataset = "acme/chat-only"
format = "chat"
chat_template = "chatml"
seq_len = 128
"""


def _dataset_cache(tmp_path):
    cache = worker_cache()
    rows = chat_rows(6)
    commit = add_repo(cache, "acme/chat-only", {"data/train-00000.jsonl": rows, "data/test.jsonl": b"{}\n"}, repo_type="dataset")
    spec = tmp_path / "ds.toml"
    spec.write_text(DATASET_SPEC.format(config=REPO / "specs" / "models" / "tiny-llama-cpu.json"))
    return cache, spec, commit


def test_gpuplan_data_reads_a_hub_dataset_from_the_cache(tmp_path):
    cache, spec, _ = _dataset_cache(tmp_path)
    r = run_cli(["data", str(spec), "--json", "-n", "1"], cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stats"]["rows"] == 6  # the train file only, not data/test.jsonl
    assert [s["text"] for s in out["examples"][0]["segments"] if s["trained"]] == ["0 + 1 = 1.<|im_end|>\n"]


def test_lock_refuses_cached_files_that_differ_from_their_pinned_sha256(tmp_path):
    cache, spec, commit = _dataset_cache(tmp_path)
    assert run_cli(["lock", str(spec)], cache, cwd=tmp_path).returncode == 0
    blob = cache / "datasets--acme--chat-only" / "snapshots" / commit / "data" / "train-00000.jsonl"
    blob.resolve().write_bytes(b'{"messages": []}\n')  # the cached file changes under the pin
    try:
        r = run_cli(["lock", str(spec)], cache, cwd=tmp_path)
    finally:
        _dataset_cache(tmp_path)  # the worker's cache holds the repo's own files again
    assert r.returncode == 1
    assert "data/train-00000.jsonl of acme/chat-only" in r.stderr and "differ from the sha256" in r.stderr
    assert "Traceback" not in r.stderr
