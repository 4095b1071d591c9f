"""Tokens per image equal what transformers 5.24's own image processors produce, for several sizes
and processor configs (built locally from their arguments: no Hub), and the copied defaults equal
the installed classes'."""

from __future__ import annotations

import pytest

from gpuplan.modelinfo import model_facts
from gpuplan.modelinfo.image_tokens import PROCESSOR_DEFAULTS, image_tokens, processor_config
from tests.helpers.vlm_configs import TINY_VLM_CONFIGS

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

SIZES = [(1024, 1024), (1024, 768), (300, 1200), (64, 64), (1920, 1080)]
FEW = [(1024, 768), (300, 1200), (64, 64)]  # Idefics3's tiles: resized with Lanczos, then cut (seconds an image)


def _vision(model_type: str):
    return model_facts(TINY_VLM_CONFIGS[model_type]).vision


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"min_pixels": 256 * 28 * 28, "max_pixels": 1280 * 28 * 28}, {"size": {"shortest_edge": 3136, "longest_edge": 200_704}}],
    ids=["defaults", "min-max-pixels", "size-dict"],
)
@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_tokens_equal_the_image_processor(model_type, kwargs):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(**kwargs)
    for w, h in SIZES:
        t = image_tokens(_vision(model_type), w, h, kwargs)
        out = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")
        _, gh, gw = (int(x) for x in out["image_grid_thw"][0])
        assert t.tower_tokens == gh * gw == out["pixel_values"].shape[0], (w, h)
        assert t.placeholders == gh * gw // proc.merge_size**2, (w, h)
        assert t.tokens == t.placeholders + 2  # <|vision_start|> ... <|vision_end|>
        assert t.resized == (gw * proc.patch_size, gh * proc.patch_size)


@pytest.mark.parametrize(
    "kwargs", [{}, {"do_image_splitting": False}, {"size": {"longest_edge": 1024}, "max_image_size": {"longest_edge": 512}}], ids=str
)
@pytest.mark.parametrize("model_type", ["idefics3", "smolvlm"])
def test_idefics3_tiles_equal_the_image_processor(model_type, kwargs):
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    proc = (Idefics3ImageProcessorPil if model_type == "idefics3" else SmolVLMImageProcessorPil)(**kwargs)
    # processing_idefics3.py: image_seq_len = (image_size // patch_size) ** 2 / scale_factor ** 2 of the model's config
    seq = (56 // 14) ** 2 // 2**2
    for w, h in FEW:
        t = image_tokens(_vision(model_type), w, h, kwargs)
        out = proc(images=[[Image.new("RGB", (w, h))]], return_tensors="np", return_row_col_info=True)
        rows, cols = out["rows"][0][0], out["cols"][0][0]
        assert t.tower_images == out["pixel_values"].shape[1] == (rows * cols + 1 if rows else 1), (w, h)
        assert t.placeholders == t.tower_images * seq
        # processing_idefics3.py replace_image_token: 2 markers per tile, a newline per row, 3 around the global image + "\n"
        assert t.tokens == t.placeholders + (2 * rows * cols + rows + 1 + 3 if rows else 3)


def test_mllama_tiles_equal_the_image_processor():
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    proc = MllamaImageProcessorPil()
    tile = proc.size["height"]
    given = {"size": dict(proc.size)}  # the processor's 224 px tiles, as its preprocessor_config.json says
    for w, h in SIZES:
        t = image_tokens(_vision("mllama"), w, h, given)
        out = proc(images=[[Image.new("RGB", (w, h))]], return_tensors="np")
        assert t.tower_images == out["pixel_values"].shape[2]  # padded to max_image_tiles
        assert out["num_tiles"][0][0] == (t.resized[0] // tile) * (t.resized[1] // tile), (w, h)
        assert t.tokens == 1  # one <|image|> token; the language model cross-attends to the tiles


def test_mllama_tiles_default_to_the_tower_image_size():
    """Without a processor config the tile is the tower's image_size (56 px in the tiny config), which
    the tower's position embeddings need, not MllamaImageProcessor's class default of 224 px."""
    t = image_tokens(_vision("mllama"), 100, 60)
    assert t.resized == (112, 112) and t.tower_tokens == (56 // 14) ** 2 + 1 and t.tokens == 1


def test_fixed_token_families():
    llava = image_tokens(_vision("llava"), 1024, 768)
    assert llava.placeholders == (56 // 14) ** 2 - 1  # vision_feature_select_strategy "default" drops the CLS token
    assert image_tokens(_vision("llava"), 10, 10, {"num_additional_image_tokens": 1}).placeholders == 16
    gemma = image_tokens(_vision("gemma3"), 1024, 768)
    assert gemma.placeholders == 256 and gemma.tokens == 260


@pytest.mark.parametrize(
    ("family", "module", "cls"),
    [
        ("qwen2_vl", "qwen2_vl.image_processing_pil_qwen2_vl", "Qwen2VLImageProcessorPil"),
        ("idefics3", "idefics3.image_processing_pil_idefics3", "Idefics3ImageProcessorPil"),
        ("smolvlm", "smolvlm.image_processing_pil_smolvlm", "SmolVLMImageProcessorPil"),
        ("mllama", "mllama.image_processing_pil_mllama", "MllamaImageProcessorPil"),
    ],
)
def test_copied_defaults_equal_the_installed_processors(family, module, cls):
    import importlib

    proc = getattr(importlib.import_module(f"transformers.models.{module}"), cls)()
    d = PROCESSOR_DEFAULTS[family]
    if family == "qwen2_vl":
        assert (d["min_pixels"], d["max_pixels"]) == (proc.size["shortest_edge"], proc.size["longest_edge"])
        assert (d["patch_size"], d["merge_size"], d["temporal_patch_size"]) == (proc.patch_size, proc.merge_size, proc.temporal_patch_size)
        assert PROCESSOR_DEFAULTS["qwen2_5_vl"] == d
    elif family == "mllama":
        assert (d["max_image_tiles"], d["tile_size"]) == (proc.max_image_tiles, proc.size["height"])
    else:
        assert (d["longest_edge"], d["max_image_size"], d["do_image_splitting"]) == (
            proc.size["longest_edge"],
            proc.max_image_size["longest_edge"],
            proc.do_image_splitting,
        )


def test_processor_seq_len_defaults():
    import inspect

    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor
    from transformers.models.llava.processing_llava import LlavaProcessor
    from transformers.models.smolvlm.processing_smolvlm import SmolVLMProcessor

    def default(cls, name):
        return inspect.signature(cls.__init__).parameters[name].default

    assert default(Idefics3Processor, "image_seq_len") == PROCESSOR_DEFAULTS["idefics3"]["image_seq_len"]
    assert default(SmolVLMProcessor, "image_seq_len") == PROCESSOR_DEFAULTS["smolvlm"]["image_seq_len"]
    assert default(Gemma3Processor, "image_seq_length") == PROCESSOR_DEFAULTS["gemma3"]["image_seq_length"]
    assert default(LlavaProcessor, "num_additional_image_tokens") == PROCESSOR_DEFAULTS["llava"]["num_additional_image_tokens"]


def test_processor_config_json_as_transformers_5_saves_it(tmp_path):
    """processor_config.json: the image processor nested, the processor's own keys beside it; it wins over a flat
    preprocessor_config.json in the same directory."""
    import json

    nested = {
        "image_processor": {"do_image_splitting": False, "max_image_size": {"longest_edge": 32}, "size": {"longest_edge": 32}},
        "image_seq_len": 4,
        "processor_class": "Idefics3Processor",
    }
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_image_splitting": True}))
    cfg = processor_config(tmp_path)
    assert cfg["do_image_splitting"] is False and cfg["image_seq_len"] == 4
    t = image_tokens(_vision("idefics3"), 32, 32, cfg)
    assert (t.tokens, t.placeholders, t.tower_images) == (7, 4, 1)  # <fake><global-img> 4 x <image> <fake>


def test_processor_config_file(tmp_path):
    import json

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 3136, "max_pixels": 401_408}))
    cfg = processor_config(tmp_path)
    small = image_tokens(_vision("qwen2_vl"), 1024, 1024, cfg)
    assert small.placeholders < image_tokens(_vision("qwen2_vl"), 1024, 1024).placeholders
    (tmp_path / "empty").mkdir()
    assert processor_config(tmp_path / "empty") == {}  # a model directory without one: the defaults
    with pytest.raises(Exception, match="file not found"):
        processor_config(tmp_path / "missing.json")


# a LLaVA-NeXT-7B-like tower (CLIP ViT-L/14 at 336 px: llava-hf/llava-v1.6-mistral-7b-hf config.json) with the
# processor's default grid pinpoints, and the tiny one of 56 px tiles with pinpoints of its own in the model config
_NEXT_336 = dict(TINY_VLM_CONFIGS["llava_next"], vision_config=dict(TINY_VLM_CONFIGS["llava_next"]["vision_config"], image_size=336))
_NEXT_56 = dict(TINY_VLM_CONFIGS["llava_next"], image_grid_pinpoints=[[56, 112], [112, 56], [112, 112], [168, 56], [56, 168]])
NEXT_SIZES = [*SIZES, (200, 100), (30, 40), (336, 336), (2000, 300), (500, 2500)]


def _llava_next_processor(tile: int, pinpoints, strategy: str, extra: int):
    """LlavaNextProcessor as a Hub repo's processor_config.json builds it (crop_size = size = the tower's image_size),
    over the byte-level tokenizer with <image> added: no download."""
    from transformers import LlavaNextProcessor
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": tile}, crop_size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints
    )
    return LlavaNextProcessor(
        image_processor=images, tokenizer=tok, patch_size=14, vision_feature_select_strategy=strategy, num_additional_image_tokens=extra
    )


@pytest.mark.slow  # builds the LLaVA-NeXT configs on the meta device, and resizes images of up to 2,500 px
@pytest.mark.parametrize(
    ("config", "strategy", "extra"),
    [(_NEXT_336, "default", 1), (_NEXT_336, "full", 0), (_NEXT_56, "default", 1)],
    ids=["336px-default", "336px-full", "56px-own-pinpoints"],
)
def test_llava_next_anyres_tokens_equal_the_processor(config, strategy, extra):
    import numpy as np

    facts = model_facts(dict(config, vision_feature_select_strategy=strategy))
    tile, pinpoints = config["vision_config"]["image_size"], [list(p) for p in facts.vision.geo("image_grid_pinpoints")]
    proc = _llava_next_processor(tile, pinpoints, strategy, extra)
    kwargs = {"num_additional_image_tokens": extra}
    for w, h in NEXT_SIZES:
        t = image_tokens(facts.vision, w, h, kwargs)
        out = proc(images=[Image.new("RGB", (w, h))], text="<image>", return_tensors="np")
        assert t.tokens == t.placeholders == int(np.sum(out["input_ids"][0] == proc.image_token_id)), (w, h)
        assert t.tower_images == out["pixel_values"].shape[1], (w, h)  # the grid's tiles + the base image
        assert t.tower_tokens == (tile // 14) ** 2 + 1  # CLIP's patches + its class token
    # the processor's own pinpoints (its processor_config.json) win over the model config's
    own = image_tokens(facts.vision, 1000, 300, {"image_grid_pinpoints": [[tile, tile]], **kwargs})
    assert own.tower_images == 2 and own.resized == (tile, tile)


def test_llava_next_crop_size_must_be_the_tower_image_size():
    from gpuplan.modelinfo import ModelConfigError

    with pytest.raises(ModelConfigError, match="crop_size height 224 differs from the vision tower's image_size 56"):
        image_tokens(_vision("llava_next"), 100, 100, {"crop_size": {"height": 224, "width": 224}})
