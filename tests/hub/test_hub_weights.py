"""A sharded Hub model: only the shards its safetensors index names are fetched and locked (Mistral-7B-v0.3's layout)."""

from __future__ import annotations

import json

from gpuplan.hub.weights import weight_patterns
from tests.helpers.apply_plans import MICRO_LLAMA
from tests.helpers.hub_cache import add_repo, run_cli, worker_cache

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
INDEX = {
    "metadata": {"total_size": 8},
    "weight_map": {"model.embed_tokens.weight": SHARDS[0], "model.norm.weight": SHARDS[1], "lm_head.weight": SHARDS[1]},
}
SPEC = """\
[model]
name_or_path = "acme/sharded"
method = "lora"

[hardware]
gpu = "A100-80GB"

[data]
seq_len = 128
"""


def _files() -> dict[str, bytes]:
    cfg = dict(MICRO_LLAMA, architectures=["LlamaForCausalLM"])
    return {
        "config.json": json.dumps(cfg).encode(),
        "model.safetensors.index.json": json.dumps(INDEX).encode(),
        SHARDS[0]: b"shard-1",
        SHARDS[1]: b"shard-2",
        "consolidated.safetensors": b"mistral-inference's single file",
        "tokenizer.json": b"{}",
    }


def test_weight_patterns_follow_the_index(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(INDEX))
    assert weight_patterns(str(tmp_path), allow_pickle=False) == SHARDS
    assert weight_patterns(str(tmp_path / "none"), allow_pickle=True) == ["*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt"]


def test_lock_hashes_the_indexed_shards_only(tmp_path):
    cache = worker_cache()
    add_repo(cache, "acme/sharded", _files())
    spec = tmp_path / "sharded.toml"
    spec.write_text(SPEC)
    r = run_cli(["lock", str(spec)], cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    files = json.loads((tmp_path / "sharded.lock.json").read_text())["repos"]["model.name_or_path"]["files"]
    assert "consolidated.safetensors" not in files
    assert set(SHARDS) | {"config.json", "model.safetensors.index.json", "tokenizer.json"} == set(files)


def test_apply_fetches_the_indexed_shards_only(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from gpuplan.hub.fetch import model_fetch_patterns
    from gpuplan.hub.weights import BASE_PATTERNS

    cache = tmp_path / "cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    commit = add_repo(cache, "acme/sharded", _files())
    assert model_fetch_patterns("acme/sharded", commit, False) == BASE_PATTERNS + SHARDS
