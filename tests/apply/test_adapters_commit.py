"""QLoRA's unquantized-module list reads the config at the planned commit, not the Hub id at main."""

from __future__ import annotations

import json

import huggingface_hub.constants

from gpuplan.apply.model.quant4 import default_unquantized
from tests.helpers.apply_plans import MICRO_LLAMA, cpu_plan
from tests.helpers.hub_cache import add_repo


def _keys(config: dict) -> list[str]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.quantizers.base import get_keys_to_not_convert

    cfg = dict(config)
    with torch.device("meta"):
        return get_keys_to_not_convert(AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)))


def test_default_unquantized_reads_the_planned_commit(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    planned = dict(MICRO_LLAMA, tie_word_embeddings=True)
    moved = dict(MICRO_LLAMA, tie_word_embeddings=False, num_hidden_layers=3)
    assert _keys(planned) != _keys(moved)
    commit = add_repo(cache, "acme/m", {"config.json": json.dumps(planned).encode()}, ref="v1")
    plan = cpu_plan(tmp_path, **{"model.name_or_path": "acme/m", "model.commit": commit, "model.from_scratch": False, "model.config": None})
    from transformers import AutoModelForCausalLM

    # only the tag v1 is cached: the id at main is not there at all
    assert default_unquantized(plan, AutoModelForCausalLM) == _keys(planned)
    add_repo(cache, "acme/m", {"config.json": json.dumps(moved).encode()}, ref="main")  # main moves elsewhere
    assert default_unquantized(plan, AutoModelForCausalLM) == _keys(planned)
