"""A vision-language model's plan: the image tokens in seq_len, what trains, the typed fields apply
reads (plan.resolved.vision), and the bad inputs refused with the key and the fix. Torch-free:
Qwen2.5-VL is counted analytically."""

from __future__ import annotations

import json

import pytest

from gpuplan.plan.types import PlanError
from tests.helpers.planning import SPECS, plan_text, spec

VLM = "qwen2.5-vl-7b"


TRAINING = "effective_batch_size = 8\nper_device_train_batch_size = 1"
FULL = 'dtype = "bfloat16"'


def _vlm(vision: str = "image_size = 1024", data: str = "seq_len = 2048", extra: str = 'method = "qlora"', gpu: str = "RTX-4090"):
    return spec(VLM, gpu=gpu, data=data, extra=extra, training=TRAINING) + f"[vision]\n{vision}\n"


def _errors(exc: PlanError) -> dict[str, str]:
    return {d.key: f"{d.summary} | fix: {d.fix}" for d in exc.diagnostics if d.severity == "error"}


def test_qlora_plan_freezes_the_tower_and_keeps_lora_off_it(tmp_path):
    plan = plan_text(tmp_path, _vlm())
    v = plan.resolved.vision
    assert v.is_vlm and v.family == "qwen2_5_vl" and v.images_per_example == 1 and not v.train_tower
    assert v.image_tokens == 1227  # 1024 px -> 980 x 980: 35 x 35 merged tokens + <|vision_start|>, <|vision_end|>
    assert v.frozen_modules == ("model.visual.patch_embed", "model.visual.blocks", "model.visual.merger")
    assert v.lora_exclude is not None and v.image_token_id == 151655
    assert plan.resolved.lora.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    adapters = plan.model.adapters
    # r = 16 on the 28 language-model layers only: (3584+3584) + 2 x (3584+512) + (3584+3584) + 3 x (3584+18944) ... x 16
    per_layer = 16 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 2 + (18944 + 3584))
    assert adapters["adapter_params"] == 28 * per_layer
    assert plan.model.vision["tower_params"] == 631_975_680
    notes = [d.summary for d in plan.diagnostics if d.key == "vision.image_size"]
    assert notes and "1 x 1,227 tokens per example" in notes[0]
    assert any("vision tower frozen" in n for n in plan.memory.notes)


def test_full_fine_tune_trains_the_projector_and_train_tower_trains_everything(tmp_path):
    full_plan = plan_text(tmp_path, _vlm(extra=FULL, gpu="B200", data="seq_len = 2048"))
    full = full_plan.resolved.vision
    assert full.frozen_modules == ("model.visual.patch_embed", "model.visual.blocks") and full.lora_exclude is None
    # what apply's audit reads live: every parameter but the frozen tower's (631,975,680 of Qwen2.5-VL-7B's)
    assert full_plan.model.total_params - full_plan.model.trainable_params == 631_975_680
    trained = plan_text(tmp_path, _vlm(vision="image_size = [640, 480]\ntrain_tower = true", gpu="B200", extra=FULL))
    assert trained.model.trainable_params == trained.model.total_params
    assert trained.resolved.vision.frozen_modules == () and trained.resolved.vision.image_size == (640, 480)
    assert any("vision tower trained" in n for n in trained.memory.notes)
    # the tower's backward costs step time
    assert (
        trained.throughput.step_time_s
        > plan_text(tmp_path, _vlm(vision="image_size = [640, 480]", gpu="B200", extra=FULL)).throughput.step_time_s
    )


def test_images_that_do_not_fit_seq_len_are_refused_with_a_length_that_holds_them(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, _vlm(vision="image_size = 1024\nimages_per_example = 2", data="seq_len = 2048"))
    msg = _errors(e.value)["data.seq_len"]
    assert "2 x 1,227 image tokens" in msg and "data.seq_len = 2816" in msg
    plan_text(tmp_path, _vlm(vision="image_size = 1024\nimages_per_example = 2", data="seq_len = 2816"))  # the fix works


def test_a_vlm_without_image_size_is_refused(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, _vlm(vision=""))
    assert "set vision.image_size = 1024" in _errors(e.value)["vision.image_size"]


def test_vision_keys_on_a_text_model_are_refused(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec() + "[vision]\nimage_size = 512\n")
    assert "is not a vision-language model" in _errors(e.value)["vision.image_size"]
    text = plan_text(tmp_path, spec())
    assert not text.resolved.vision.is_vlm and text.resolved.vision.image_tokens == 0


def test_processor_config_changes_the_tokens(tmp_path):
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": {"max_pixels": 401_408}}))
    plan = plan_text(tmp_path, _vlm(vision=f'image_size = 1024\nprocessor_config = "{tmp_path / "processor_config.json"}"'))
    assert plan.resolved.vision.image_tokens == (22 * 22) + 2  # 616 x 616: 44 x 44 patches, 2 x 2 merged


def test_the_shipped_spec_plans_and_fits_24_gb(tmp_path):
    from gpuplan.plan.build import plan_file
    from tests.helpers.planning import ENV

    plan = plan_file(SPECS / "qwen2.5-vl-7b-qlora-24gb.toml", environment=ENV)
    assert plan.memory.fits and plan.resolved.vision.image_tokens == 1227


@pytest.mark.parametrize("checkpointing", [False, True])
def test_mllamas_frozen_tower_note_says_whether_backward_runs_through_it(tmp_path, checkpointing):
    # transformers' gradient checkpointing hooks the tower's patch embedding (enable_input_require_grads) and
    # mllama's tower blocks are not checkpointed: frozen, they are still recorded and backward runs through them
    from tests.helpers.vlm_configs import TINY_VLM_CONFIGS

    config = tmp_path / "mllama.json"
    config.write_text(json.dumps(TINY_VLM_CONFIGS["mllama"]))
    text = f"""
[model]
config = "{config}"
method = "lora"
dtype = "bfloat16"
[hardware]
gpu = "A100-80GB"
[data]
seq_len = 256
[training]
{TRAINING}
gradient_checkpointing = {str(checkpointing).lower()}
[vision]
image_size = 56
"""
    plan = plan_text(tmp_path, text)
    assert plan.resolved.training.gradient_checkpointing is checkpointing
    detail = next(d.detail for d in plan.diagnostics if d.key == "vision.image_size")
    assert ("backward still runs through its blocks" in detail) is checkpointing
    assert ("backward does not run through it" in detail) is not checkpointing
