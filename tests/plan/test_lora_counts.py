"""Trainable adapter counts without torch equal peft's get_nb_trainable_parameters.

One config per shipped family, each task it supports, built on the meta device
(peft injects its adapters into meta models too), with the target list the plan
resolves ("all-linear" and an attention-only list), DoRA on and off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuplan.modelinfo import TASKS, model_facts, read_config
from gpuplan.modelinfo.lora_targets import TargetError, count_adapters, default_modules_to_save, resolve_targets
from gpuplan.modelinfo.registry import FAMILIES
from gpuplan.modelinfo.vision_families import VLM_FAMILIES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = Path(__file__).resolve().parents[2] / "specs" / "models"
# one shipped config per family (the smallest), layers cut to 2: counts are per layer
_BY_FAMILY: dict[str, Path] = {}
for _p in sorted(MODELS.glob("*.json"), key=lambda p: p.stat().st_size):
    if json.loads(_p.read_text())["model_type"] not in VLM_FAMILIES:  # tests/modelinfo/test_vision_counts.py
        _BY_FAMILY.setdefault(json.loads(_p.read_text())["model_type"], _p)
CASES = [(p.stem, task) for fam, p in sorted(_BY_FAMILY.items()) for task in FAMILIES[fam][1]]
ATTENTION = {
    "llama": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "gpt_neox": ["query_key_value"],
    "bert": ["query", "value"],
    "opt": ["q_proj", "v_proj"],
    "phi3": ["qkv_proj"],
}


def _small(stem: str) -> dict:
    cfg = dict(read_config(MODELS / f"{stem}.json"))
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in cfg:
            cfg[key] = 2
    cfg.pop("layer_types", None)
    return cfg


def _peft_counts(cfg: dict, task: str, targets: list[str], saved: list[str] | None, r: int, dora: bool):
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    hf = transformers.AutoConfig.for_model(cfg["model_type"], **kwargs)
    with torch.device("meta"):
        model = getattr(transformers, TASKS[task]).from_config(hf)
    task_type = {"causal-lm": "CAUSAL_LM", "seq-cls": "SEQ_CLS"}.get(task)
    lc = peft.LoraConfig(
        r=r, lora_alpha=2 * r, target_modules=targets, use_dora=dora, modules_to_save=list(saved) if saved else None, task_type=task_type
    )
    return peft.get_peft_model(model, lc).get_nb_trainable_parameters()


@pytest.mark.parametrize("stem,task", CASES)
@pytest.mark.parametrize("which,r,dora", [("all-linear", 8, False), ("attention", 16, True)])
def test_trainable_params_equal_peft(stem, task, which, r, dora):
    cfg = _small(stem)
    facts = model_facts(cfg, task)
    saved = default_modules_to_save(facts, None) or []
    if which == "all-linear":
        asked = "all-linear"
    else:
        style = {
            "mistral": "llama",
            "qwen2": "llama",
            "qwen3": "llama",
            "gemma": "llama",
            "gemma2": "llama",
            "mixtral": "llama",
            "phi": "opt",
            "roberta": "bert",
        }.get(facts.model_type, facts.model_type)
        asked = ATTENTION[style]
    targets = resolve_targets(facts, asked, saved)
    ours = count_adapters(facts, targets, r, dora, saved)
    trainable, total = _peft_counts(cfg, task, targets, saved, r, dora)
    assert (ours.trainable_params, ours.total_params) == (trainable, total)
    assert ours.adapter_params > 0


def test_all_linear_resolves_to_the_layer_names_of_llama():
    facts = model_facts(read_config(MODELS / "llama-3.1-8b.json"))
    assert resolve_targets(facts, "all-linear", []) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # Llama-3.1-8B, r = 16, all-linear: 32 layers x 16 x (4096+4096 + 4096+1024 + 4096+1024 + 4096+4096
    # + 4096+14336 + 4096+14336 + 14336+4096) = 41,943,040 (peft prints the same)
    assert count_adapters(facts, resolve_targets(facts, "all-linear", []), 16, False, []).trainable_params == 41_943_040


def test_unknown_target_gets_a_did_you_mean():
    facts = model_facts(read_config(MODELS / "llama-3.1-8b.json"))
    with pytest.raises(TargetError, match="did you mean 'q_proj'"):
        resolve_targets(facts, ["q_porj"], [])
    with pytest.raises(TargetError, match="not a linear layer"):
        resolve_targets(facts, ["embed_tokens"], [])


@pytest.mark.parametrize("stem", ["llama-3.2-1b", "mistral-7b-v0.3", "gpt2"])
def test_saved_lm_head_counts_equal_peft_tied_or_not(stem):
    cfg = _small(stem)
    facts = model_facts(cfg)
    targets = resolve_targets(facts, "all-linear", ["lm_head"])
    ours = count_adapters(facts, targets, 4, False, ["lm_head"])
    assert (ours.trainable_params, ours.total_params) == _peft_counts(cfg, "causal-lm", targets, ["lm_head"], 4, False)


def test_unknown_saved_module_gets_a_did_you_mean():
    from gpuplan.modelinfo.lora_targets import check_saved

    facts = model_facts(read_config(MODELS / "llama-3.1-8b.json"))
    check_saved(facts, ["lm_head", "embed_tokens"])
    with pytest.raises(TargetError, match="did you mean 'lm_head'"):
        check_saved(facts, ["lm_haed"])
