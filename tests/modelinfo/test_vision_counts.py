"""A vision-language model's parameters, split into tower, projector and language model, equal what
transformers 5.24 builds (AutoModelForImageTextToText on the meta device), for a small config of
every family, the shipped Qwen2.5-VL-7B config and the published total."""

from __future__ import annotations

import functools
import json

import pytest

from gpuplan.modelinfo import ModelConfigError, model_facts, read_config
from gpuplan.modelinfo.vision_families import ANALYTIC, VLM_FAMILIES
from tests.helpers.planning import SPECS
from tests.helpers.vlm_configs import TINY_VLM_CONFIGS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# the attributes of <F>Model holding the language model and the projector (modeling_<family>.py)
LM_ATTR = {"idefics3": "text_model", "smolvlm": "text_model"}
PROJECTOR_ATTR = {"qwen2_vl": "visual.merger", "qwen2_5_vl": "visual.merger", "idefics3": "connector", "smolvlm": "connector"}


@functools.cache
def _meta_model(model_type: str, config_json: str):
    config = json.loads(config_json)
    hf = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(hf)


def _meta(model_type: str, config: dict):
    return _meta_model(model_type, json.dumps(config, sort_keys=True))


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_family_has_a_small_config():
    assert set(TINY_VLM_CONFIGS) == set(VLM_FAMILIES)


# the meta-device families import their transformers modeling modules (seconds each on a shared CPU)
@pytest.mark.parametrize(
    "model_type", [pytest.param(mt, marks=() if mt in ANALYTIC else pytest.mark.slow) for mt in sorted(TINY_VLM_CONFIGS)]
)
def test_split_equals_the_modules_transformers_builds(model_type):
    config = TINY_VLM_CONFIGS[model_type]
    model = _meta(model_type, config)
    facts = model_facts(config)
    v = facts.vision
    assert v is not None and v.family == model_type
    assert facts.n_params == sum(p.numel() for p in model.parameters())
    assert facts.param_shapes == tuple((n, tuple(p.shape)) for n, p in model.named_parameters())
    assert facts.source == ("analytic" if model_type in ANALYTIC else "meta-device")
    # the language model and projector as the live modules hold them, the tower the rest
    lm = _numel(_get(model.model, LM_ATTR.get(model_type, "language_model")))
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    head = 0 if tied else model.lm_head.weight.numel()
    projector = _numel(_get(model.model, PROJECTOR_ATTR.get(model_type, "multi_modal_projector")))
    if model_type == "llava_next":
        projector += model.model.image_newline.numel()
    assert (v.language_model_params, v.projector_params) == (lm + head, projector)
    assert v.tower_params == facts.n_params - lm - head - projector
    vc = model.config.vision_config
    assert v.patch_size == (vc.patch_size if isinstance(vc.patch_size, int) else vc.patch_size[0])
    # the language model's dims are the text config's
    assert facts.hidden_size == model.config.get_text_config().hidden_size
    assert facts.vocab_size == model.config.get_text_config().vocab_size


def test_shipped_qwen2_5_vl_7b_counts_as_published():
    config = read_config(SPECS / "models" / "qwen2.5-vl-7b.json")
    facts = model_facts(config, allow_meta_fallback=False)  # analytic: no torch
    # Qwen/Qwen2.5-VL-7B-Instruct safetensors metadata: 8,292,166,656 parameters; its language model is Qwen2.5-7B's 7,615,616,512
    assert facts.n_params == 8_292_166_656
    v = facts.vision
    assert (v.tower_params, v.projector_params, v.language_model_params) == (631_975_680, 44_574_464, 7_615_616_512)
    model = _meta("qwen2_5_vl", config)
    assert facts.param_shapes == tuple((n, tuple(p.shape)) for n, p in model.named_parameters())


def test_a_vlm_is_planned_as_causal_lm_only():
    with pytest.raises(ModelConfigError, match='set model.task = "causal-lm"'):
        model_facts(TINY_VLM_CONFIGS["qwen2_vl"], "seq-cls")


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "idefics3"])
@pytest.mark.parametrize("train_tower", [False, True], ids=["tower-frozen", "tower-trained"])
def test_lora_counts_equal_peft_with_the_tower_excluded(model_type, train_tower):
    """The plan's adapters ("all-linear" resolved without the frozen tower and projector) are what peft
    builds with LoraConfig(exclude_modules=plan.resolved.vision.lora_exclude)."""
    peft = pytest.importorskip("peft")
    from gpuplan.modelinfo.image_tokens import image_tokens
    from gpuplan.modelinfo.lora_targets import count_adapters, resolve_targets
    from gpuplan.plan.vision_settings import ImagePlan

    config = TINY_VLM_CONFIGS[model_type]
    facts = model_facts(config)
    plan = ImagePlan(facts.vision, 64, 64, 1, train_tower, image_tokens(facts.vision, 64, 64), None)
    excluded = plan.frozen_modules(adapters=True)
    targets = resolve_targets(facts, "all-linear", [], excluded)
    ours = count_adapters(facts, targets, 8, False, [], excluded)
    hf = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(hf)
    lc = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, exclude_modules=plan.lora_exclude())
    trainable, _ = peft.get_peft_model(model, lc).get_nb_trainable_parameters()
    assert ours.trainable_params == trainable
    tower = any(name.startswith(facts.vision.tower_modules) for name, *_ in ours.target_layers)
    assert tower == train_tower  # adapters in the tower only when it trains
