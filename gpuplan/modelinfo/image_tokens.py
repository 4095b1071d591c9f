"""Tokens an image becomes, from the processor's configuration: in the language model's sequence
(what data.seq_len must hold) and through the vision tower (what its activations cost).

Each family follows its transformers 5.24 processor (image size, min/max pixels, patch size,
spatial merge, tiling); the processor's keys come from its preprocessor_config.json where the
plan has one, else the image processor class defaults copied in PROCESSOR_DEFAULTS
(tests/modelinfo/test_image_tokens.py checks both against the installed processors):
- qwen2_vl / qwen2_5_vl (image_processing_qwen2_vl.py smart_resize, get_number_of_image_patches;
  processing_qwen2_vl.py): the image resized to multiples of patch x merge within
  [min_pixels, max_pixels], one tower token per patch, one LM token per merge x merge patches,
  between <|vision_start|> and <|vision_end|> (the chat template's two markers).
- idefics3 / smolvlm (image_processing_pil_idefics3.py resize, resize_for_vision_encoder,
  split_images; processing_idefics3.py replace_image_token): the longest edge to size, then to
  multiples of max_image_size, cut into rows x cols tiles plus one global image, each tile
  image_seq_len tokens after <fake_token_around_image><row_r_col_c>, a newline per row.
- llava (processing_llava.py): the image resized to the tower's image_size,
  (image_size / patch)^2 + num_additional_image_tokens tokens, less the CLS token under the
  "default" feature strategy.
- llava_next (processing_llava_next.py LlavaNextProcessor._get_number_of_features,
  _get_unpadded_features; image_processing_utils.py select_best_resolution;
  image_processing_pil_llava_next.py get_image_patches; modeling_llava_next.py
  image_size_to_num_patches, pack_image_features): "anyres", the grid pinpoint that keeps the
  most of the image (then wastes the least) cut into tiles of the tower's image size plus the
  whole image resized to one tile; the tiles' features unpadded to the image's aspect ratio, an
  image_newline per row, then the base image's (image_size / patch)^2 (+ additional) features.
- gemma3 (processing_gemma3.py full_image_sequence): mm_tokens_per_image tokens between the
  begin/end-of-image markers, with a blank line either side (pan-and-scan off, its default).
- mllama (processing_mllama.py, image_processing_mllama.py get_optimal_tiled_canvas): one
  <|image|> token in the sequence (the language model cross-attends to the tower's output),
  the image tiled into at most max_image_tiles tiles of the processor's size, each
  (image_size / patch)^2 + 1 tower tokens (the class token).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.facts import VisionFacts

# image processor (and processor) defaults, transformers 5.24
PROCESSOR_DEFAULTS: dict[str, dict[str, Any]] = {
    # image_processing_qwen2_vl.py Qwen2VLImageProcessor: size {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
    "qwen2_vl": {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2},
    "qwen2_5_vl": {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2},
    # image_processing_idefics3.py Idefics3ImageProcessor; processing_idefics3.py image_seq_len = 169
    "idefics3": {"longest_edge": 4 * 364, "max_image_size": 364, "do_image_splitting": True, "image_seq_len": 169},
    # image_processing_smolvlm.py SmolVLMImageProcessor; processing_smolvlm.py image_seq_len = 169
    "smolvlm": {"longest_edge": 4 * 364, "max_image_size": 364, "do_image_splitting": True, "image_seq_len": 169},
    # processing_llava.py LlavaProcessor(num_additional_image_tokens=0)
    "llava": {"num_additional_image_tokens": 0},
    # processing_llava_next.py LlavaNextProcessor(num_additional_image_tokens=0); the grid pinpoints are the
    # processor's image_grid_pinpoints, else the model config's (configuration_llava_next.py LlavaNextConfig)
    "llava_next": {"num_additional_image_tokens": 0},
    # processing_gemma3.py Gemma3Processor(image_seq_length=256); image_processing_gemma3.py do_pan_and_scan False
    "gemma3": {"image_seq_length": 256, "do_pan_and_scan": False},
    # image_processing_mllama.py MllamaImageProcessor: max_image_tiles = 4, size 224 x 224 (the tile)
    "mllama": {"max_image_tiles": 4, "tile_size": 224},
}
MAX_IMAGE_SIZE = 4096  # image_processing_idefics3.py: the upper bound of a resized side


@dataclass(frozen=True)
class ImageTokens:
    """One image of (width, height) through the processor."""

    tokens: int  # in the language model's input_ids: placeholders + the processor's markers
    placeholders: int  # of tokens, the image-token placeholders the tower's features fill
    tower_images: int  # images the tower encodes for it (tiles, the global image)
    tower_tokens: int  # tokens per tower image (its sequence length)
    resized: tuple[int, int]  # (width, height) the processor resizes it to
    how: str  # the processor's arithmetic, for the plan's reason


PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def processor_config(path: str | Path | None) -> dict[str, Any]:
    """The processor's keys from a model directory or one file; {} when there is none.

    transformers 5 saves one processor_config.json with the image processor nested under
    "image_processor" and the processor's own keys (Idefics3's image_seq_len) beside it
    (processing_utils.py ProcessorMixin.save_pretrained); repos saved by 4.x have a flat
    preprocessor_config.json. A directory's files are read in that order, the first key wins."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_dir():
        return _read_processor_file(p)
    out: dict[str, Any] = {}
    for name in PROCESSOR_FILES:
        if (p / name).is_file():
            out = {**_read_processor_file(p / name), **out}
    return out


def _read_processor_file(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelConfigError(
            p, "file not found; point vision.processor_config at a processor_config.json or preprocessor_config.json"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(p, f"cannot read the processor config: {exc}") from None
    if not isinstance(data, dict):
        raise ModelConfigError(p, f"expected a JSON object at the top level, got {type(data).__name__}")
    nested = data.get("image_processor")
    if isinstance(nested, dict):
        data = {**nested, **{k: v for k, v in data.items() if k != "image_processor"}}
    return data


def _settings(vision: VisionFacts, given: Mapping[str, Any]) -> dict[str, Any]:
    """The processor's keys: the family defaults, overridden by the config's (with its size dict spelled out)."""
    family = vision.family
    out = dict(PROCESSOR_DEFAULTS.get(family, {}))
    if family in ("idefics3", "smolvlm"):
        # processing_idefics3.py: image_seq_len = int(((image_size // patch_size) ** 2) / (scale_factor**2)),
        # what the model's connector gives per tile; the processor default (169) is Idefics3-8B's
        out["image_seq_len"] = int((vision.geo("image_size") // vision.patch_size) ** 2 / vision.geo("scale_factor") ** 2)
    if family == "llava_next":
        out.update(_llava_next_settings(vision, given))
    if family == "mllama":
        # without a processor config, the tile is the tower's image_size (its position embeddings fix
        # (image_size / patch)^2 + 1 patches a tile: MllamaPrecomputedPositionEmbedding), not the
        # image processor class's 224 (Llama-3.2-11B-Vision's preprocessor_config.json: 560 x 560)
        out["tile_size"] = int(vision.geo("image_size"))
    size = given.get("size")
    if isinstance(size, Mapping) and family != "llava_next":
        if family in ("qwen2_vl", "qwen2_5_vl"):
            out.update({k: size[s] for k, s in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")) if s in size})
        elif family == "mllama" and "height" in size:
            out["tile_size"] = size["height"]
        elif "longest_edge" in size:
            out["longest_edge"] = size["longest_edge"]
    mis = given.get("max_image_size")
    if isinstance(mis, Mapping) and "longest_edge" in mis:
        out["max_image_size"] = mis["longest_edge"]
    for k, v in given.items():
        if k in out and k not in ("size", "max_image_size") and v is not None:
            out[k] = v
    return out


def _llava_next_settings(vision: VisionFacts, given: Mapping[str, Any]) -> dict[str, Any]:
    """LLaVA-NeXT's tile (the processor's crop_size, which pack_image_features needs equal to the
    tower's image_size), grid pinpoints, patch size and feature strategy: the processor's, else the model's."""
    tile = int(vision.geo("image_size"))
    crop = given.get("crop_size")
    if isinstance(crop, Mapping) and crop.get("height") not in (None, tile):
        raise ModelConfigError(
            None,
            f"llava_next processor crop_size height {crop['height']} differs from the vision tower's image_size {tile}; "
            "set the processor's crop_size to the tower's image_size",
        )
    pinpoints = given.get("image_grid_pinpoints") or vision.geo("image_grid_pinpoints")
    return {
        "tile": tile,
        "image_grid_pinpoints": [tuple(int(x) for x in hw) for hw in pinpoints],
        "patch_size": int(given.get("patch_size") or vision.patch_size),
        "vision_feature_select_strategy": given.get("vision_feature_select_strategy") or vision.geo("vision_feature_select_strategy"),
    }


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) as image_processing_qwen2_vl.py smart_resize computes them."""
    if max(height, width) / min(height, width) > 200:
        raise ModelConfigError(None, f"image {width}x{height}: Qwen2-VL's processor refuses an aspect ratio above 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def _qwen(v: VisionFacts, width: int, height: int, s: Mapping[str, Any]) -> ImageTokens:
    patch, merge = int(s["patch_size"]), int(s["merge_size"])
    h, w = smart_resize(height, width, patch * merge, int(s["min_pixels"]), int(s["max_pixels"]))
    patches = (h // patch) * (w // patch)
    n = patches // (merge * merge)
    bounds = f"{s['min_pixels']:,}..{s['max_pixels']:,} pixels"
    how = f"resized to {w}x{h} (multiples of {patch * merge} px, {bounds}): {patches:,} patches of {patch} px, {merge}x{merge} merged"
    return ImageTokens(n + 2, n, 1, patches, (w, h), how)


def _rescale_to_max_len(height: int, width: int, max_len: int) -> tuple[int, int]:
    aspect = width / height
    if width >= height:
        width = max_len
        height = int(width / aspect)
        height += height % 2
    else:
        height = max_len
        width = int(height * aspect)
        width += width % 2
    return max(height, 1), max(width, 1)


def _below_upper_bound(height: int, width: int, max_len: int) -> tuple[int, int]:
    aspect = width / height
    if width >= height and width > max_len:
        width = max_len
        height = int(width / aspect)
    elif height > width and height > max_len:
        height = max_len
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def _idefics3(v: VisionFacts, width: int, height: int, s: Mapping[str, Any]) -> ImageTokens:
    tile, seq = int(s["max_image_size"]), int(s["image_seq_len"])
    h, w = _rescale_to_max_len(height, width, int(s["longest_edge"]))
    h, w = _below_upper_bound(h, w, MAX_IMAGE_SIZE)
    tower_tokens = (v.geo("image_size") // v.patch_size) ** 2
    if not s["do_image_splitting"]:
        return ImageTokens(seq + 3, seq, 1, tower_tokens, (tile, tile), f"resized to {tile}x{tile}, one image of {seq} tokens")
    aspect = w / h  # resize_for_vision_encoder: up to multiples of the tile
    if w >= h:
        w = math.ceil(w / tile) * tile
        h = math.ceil(int(w / aspect) / tile) * tile
    else:
        h = math.ceil(h / tile) * tile
        w = math.ceil(int(h * aspect) / tile) * tile
    rows, cols = (h // tile, w // tile) if (h > tile or w > tile) else (0, 0)
    if rows == 0:
        return ImageTokens(seq + 3, seq, 1, tower_tokens, (w, h), f"resized to {w}x{h}: one tile of {seq} tokens")
    tiles = rows * cols
    # per tile <fake_token_around_image><row_r_col_c> + seq; a newline per row; then
    # "\n" <fake_token_around_image><global-img> + seq + <fake_token_around_image>
    placeholders = (tiles + 1) * seq
    markers = 2 * tiles + rows + 1 + 3
    how = f"resized to {w}x{h}: {rows}x{cols} tiles of {tile} px + 1 global image, {seq} tokens each"
    return ImageTokens(placeholders + markers, placeholders, tiles + 1, tower_tokens, (w, h), how)


def _llava(v: VisionFacts, width: int, height: int, s: Mapping[str, Any]) -> ImageTokens:
    side = int(v.geo("image_size"))
    grid = (side // v.patch_size) ** 2
    n = grid + int(s["num_additional_image_tokens"]) - (1 if v.geo("vision_feature_select_strategy") == "default" else 0)
    return ImageTokens(n, n, 1, grid + 1, (side, side), f"resized to {side}x{side}: {grid} patches of {v.patch_size} px")


def select_best_resolution(height: int, width: int, pinpoints: list[tuple[int, int]]) -> tuple[int, int]:
    """(height, width) of the pinpoint image_processing_utils.py select_best_resolution picks: the most
    of the image kept after an aspect-preserving fit, then the least canvas wasted."""
    best, most, waste = pinpoints[0], 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - kept
        if kept > most or (kept == most and wasted < waste):
            best, most, waste = (h, w), kept, wasted
    return best


def _llava_next(v: VisionFacts, width: int, height: int, s: Mapping[str, Any]) -> ImageTokens:
    tile, patch = int(s["tile"]), int(s["patch_size"])
    best_h, best_w = select_best_resolution(height, width, s["image_grid_pinpoints"])
    grid = tile // patch  # patches per tile side
    # _get_unpadded_features: the grid's patches less the rows (or columns) of padding the
    # aspect-preserving fit left, one image_newline per remaining row
    cur_h, cur_w = grid * (best_h // tile), grid * (best_w // tile)
    if width / height > cur_w / cur_h:
        cur_h -= (cur_h - int(round(height * (cur_w / width), 7))) // 2 * 2
    else:
        cur_w -= (cur_w - int(round(width * (cur_h / height), 7))) // 2 * 2
    # the base image's features: the grid, any additional (CLS) tokens, less the CLS under "default"
    base = grid * grid + int(s["num_additional_image_tokens"]) - (1 if s["vision_feature_select_strategy"] == "default" else 0)
    n = cur_h * cur_w + cur_h + base
    # image_size_to_num_patches: the grid's tiles plus the whole image resized to one tile
    tiles = (best_h // tile) * (best_w // tile)
    how = (
        f"anyres: fitted to the {best_w}x{best_h} grid pinpoint, {best_h // tile}x{best_w // tile} tiles of {tile} px + 1 base image; "
        f"{cur_h}x{cur_w} unpadded patches + {cur_h} row newlines + {base} base"
    )
    return ImageTokens(n, n, tiles + 1, grid * grid + 1, (best_w, best_h), how)


def _gemma3(v: VisionFacts, width: int, height: int, s: Mapping[str, Any]) -> ImageTokens:
    if s.get("do_pan_and_scan"):
        raise ModelConfigError(None, "gemma3 with do_pan_and_scan: the crops per image are not modelled; set do_pan_and_scan false")
    n = int(s["image_seq_length"])
    side = int(v.geo("image_size"))
    # "\n\n" <start_of_image> n x <image_soft_token> <end_of_image> "\n\n"
    return ImageTokens(n + 4, n, 1, (side // v.patch_size) ** 2, (side, side), f"resized to {side}x{side}: {n} tokens per image")


def _mllama(v: VisionFacts, width: int, height: int, s: Mapping[str, Any]) -> ImageTokens:
    tile, most = int(s["tile_size"]), int(s["max_image_tiles"])
    # get_all_supported_aspect_ratios, then get_optimal_tiled_canvas: each (a, b) with a x b <= the
    # tile limit is a canvas of a x tile rows by b x tile columns (as the code indexes them); the
    # least upscaling wins, else the least downscaling, then the smallest area
    canvases = [(a * tile, b * tile) for a in range(1, most + 1) for b in range(1, most + 1) if a * b <= most]
    scales = [min(ch / height, cw / width) for ch, cw in canvases]
    up = [x for x in scales if x >= 1]
    chosen = min(up) if up else max(scales)
    ch, cw = min((c for c, x in zip(canvases, scales, strict=True) if x == chosen), key=lambda c: c[0] * c[1])
    rows, cols = ch // tile, cw // tile
    tower_tokens = (tile // v.patch_size) ** 2 + 1
    # the processor pads every image to max_image_tiles tiles, and the tower encodes them all
    how = f"{rows}x{cols} tiles of {tile} px, padded to {most} tiles for the tower"
    return ImageTokens(1, 1, most, tower_tokens, (cols * tile, rows * tile), how)


_FAMILIES = {
    "qwen2_vl": _qwen,
    "qwen2_5_vl": _qwen,
    "idefics3": _idefics3,
    "smolvlm": _idefics3,
    "llava": _llava,
    "llava_next": _llava_next,
    "gemma3": _gemma3,
    "mllama": _mllama,
}


def image_tokens(vision: VisionFacts, width: int, height: int, processor: Mapping[str, Any] | None = None) -> ImageTokens:
    """One image of width x height px through `vision.family`'s processor (its config: `processor`)."""
    fn = _FAMILIES.get(vision.family)
    if fn is None:
        raise ModelConfigError(
            None,
            f"the image tokens of a {vision.family} model are not modelled (modelled: {', '.join(sorted(_FAMILIES))})",
        )
    return fn(vision, width, height, _settings(vision, processor or {}))
