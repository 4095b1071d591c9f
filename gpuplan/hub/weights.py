"""Which weight files of a Hub model to fetch: those its index names, else every file of the format.

A sharded checkpoint ships an index (model.safetensors.index.json; pytorch_model.bin.index.json
for pickles) whose "weight_map" names each shard, the files transformers'
from_pretrained loads (modeling_utils: get_checkpoint_shard_files). Other weight files
beside it are not read: Mistral-7B-v0.3 also ships its 14.5 GB consolidated.safetensors
for mistral-inference. So the model's small files are fetched first, and with an index
only the shards it names follow (and `gpuplan lock` hashes only those).
"""

from __future__ import annotations

import json
import os

BASE_PATTERNS = ["*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
SAFETENSORS = ("model.safetensors.index.json", ["*.safetensors"])
PICKLES = ("pytorch_model.bin.index.json", ["*.bin", "*.pt", "*.pth", "*.ckpt"])


def indexed_files(folder: str, index_name: str) -> list[str] | None:
    """The shard files an index in `folder` names (None without an index, or one that does not parse)."""
    try:
        with open(os.path.join(folder, index_name), encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(weight_map, dict) or not weight_map:
        return None
    return sorted({str(v) for v in weight_map.values()})


def weight_patterns(folder: str, allow_pickle: bool) -> list[str]:
    """Patterns of the weight files to fetch, given a snapshot folder holding the small files."""
    out: list[str] = []
    for index_name, every in (SAFETENSORS, *((PICKLES,) if allow_pickle else ())):
        named = indexed_files(folder, index_name)
        out += named if named is not None else every
    return out
