"""data.split picks a Hub dataset's files by its card's configs (ultrachat_200k's layout), else by file names."""

from __future__ import annotations

import json

import tomllib

from gpuplan.hub.splits import SplitError, card_patterns, split_map
from tests.helpers.hub_cache import REPO, add_repo, chat_rows, run_cli, worker_cache

# HuggingFaceH4/ultrachat_200k's card at its main commit, cut to the configs header
ULTRACHAT_CARD = b"""---
language:
- en
configs:
- config_name: default
  data_files:
  - split: train_sft
    path: data/train_sft-*
  - split: test_sft
    path: data/test_sft-*
  - split: train_gen
    path: data/train_gen-*
  - split: test_gen
    path: data/test_gen-*
---
# UltraChat 200k
"""

SPEC = """\
[model]
config = "{config}"
from_scratch = true

[hardware]
gpu = "cpu"

[data]
dataset = "acme/ultra"
format = "chat"
chat_template = "chatml"
seq_len = 128
{split}
"""


def _cache(tmp_path, split=""):
    cache = worker_cache()
    files = {
        "README.md": ULTRACHAT_CARD,
        "data/train_sft-00000-of-00001.jsonl": chat_rows(6),
        "data/train_gen-00000-of-00001.jsonl": chat_rows(4),
        "data/test_sft-00000-of-00001.jsonl": chat_rows(2),
        "data/test_gen-00000-of-00001.jsonl": chat_rows(3),
    }
    commit = add_repo(cache, "acme/ultra", files, repo_type="dataset")
    spec = tmp_path / "ultra.toml"
    spec.write_text(SPEC.format(config=REPO / "specs" / "models" / "tiny-llama-cpu.json", split=split))
    return cache, spec, commit


def test_card_configs_map_splits_to_files(tmp_path):
    card = tmp_path / "README.md"
    card.write_bytes(ULTRACHAT_CARD)
    assert card_patterns(str(card), "train_sft") == ["data/train_sft-*"]
    try:
        card_patterns(str(card), "train")
    except SplitError as e:
        assert 'did you mean "train_sft"?' in str(e) and "train_gen" in str(e)
        assert e.fix == 'set data.split = "train_sft"'
    else:
        raise AssertionError("a split the card lacks must be refused")
    assert split_map([{"config_name": "default", "data_files": "data/*.parquet"}]) == {"train": ["data/*.parquet"]}
    assert split_map(
        [
            {"config_name": "a", "data_files": "a/*"},
            {"config_name": "b", "default": True, "data_files": [{"split": "train", "path": ["b/x", "b/y"]}]},
        ]
    ) == {"train": ["b/x", "b/y"]}


def test_data_split_reads_only_that_splits_rows(tmp_path):
    cache, spec, _ = _cache(tmp_path, 'split = "train_sft"')
    r = run_cli(["data", str(spec), "--json", "-n", "1"], cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stats"]["rows"] == 6  # train_sft only: not train_gen (4) nor the test splits


def test_plan_refuses_a_split_the_card_lacks_with_a_did_you_mean(tmp_path):
    cache, spec, _ = _cache(tmp_path)  # data.split defaults to "train", which ultrachat_200k does not have
    r = run_cli(["plan", str(spec)], cache, cwd=tmp_path)
    assert r.returncode == 1
    assert "data.split" in r.stderr and 'did you mean "train_sft"?' in r.stderr
    assert "Traceback" not in r.stderr


def test_lock_hashes_only_the_splits_files(tmp_path):
    cache, spec, _ = _cache(tmp_path, 'split = "train_sft"')
    r = run_cli(["lock", str(spec)], cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    files = json.loads((tmp_path / "ultra.lock.json").read_text())["repos"]["data.dataset"]["files"]
    assert sorted(files) == ["README.md", "data/train_sft-00000-of-00001.jsonl"]


def test_data_split_without_a_hub_dataset_is_a_warning(tmp_path):
    from tests.helpers.planning import plan_text, spec

    plan = plan_text(
        tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data='seq_len = 128\nsplit = "test"', training="effective_batch_size = 16")
    )
    [d] = [d for d in plan.diagnostics if d.key == "data.split"]
    assert d.severity == "warning" and "read only with data.dataset" in d.summary


def test_init_data_from_a_card_without_a_train_split_writes_its_train_split_and_reads_its_rows(tmp_path):
    """ultrachat_200k's layout: init --data picks train_sft (the card maps no "train"), writes data.split
    with the reason, and reads the format from train_sft's rows, not from the first file of the snapshot
    (test_gen here holds instruction rows); the spec then plans as written. Before, init read test_gen and
    ended in plan's "set data.split", a key init cannot set, with nothing written."""
    cache = worker_cache()
    pairs = b"".join(json.dumps({"prompt": f"q{i}", "response": f"a{i}"}).encode() + b"\n" for i in range(3))
    add_repo(
        cache,
        "acme/ultra",
        {"README.md": ULTRACHAT_CARD, "data/train_sft-00000-of-00001.jsonl": chat_rows(6), "data/test_gen-00000-of-00001.jsonl": pairs},
        repo_type="dataset",
    )
    out = tmp_path / "init.toml"
    r = run_cli(
        ["init", str(REPO / "specs" / "models" / "tiny-llama-cpu.json"), "--gpu", "cpu", "--data", "acme/ultra", "--out", str(out)],
        cache,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    raw = tomllib.loads(text)
    assert raw["data"]["split"] == "train_sft" and raw["data"]["format"] == "chat"
    note = " ".join(ln.removeprefix("# ") for ln in text.split("\nsplit = ")[0].splitlines()[-2:])
    assert 'maps no "train" split (it has train_sft, test_sft, train_gen, test_gen)' in note
    plan = run_cli(["plan", str(out)], cache, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
