"""A tiny Idefics3 vision-language model with its processor, built in code and saved: the VLM tests' base.

Idefics3 rather than Qwen2-VL: transformers 5.24's Qwen2VLProcessor always takes a video
processor, whose base class (BaseVideoProcessor) is importable only with torchvision;
Idefics3Processor needs PIL alone. Nothing is downloaded: the tokenizer is gpuplan's byte-level
one (apply/data/tokenizer.py) with Idefics3's image tokens added, the chat template is written
here, and the image processor is transformers' PIL Idefics3ImageProcessorPil.

One 32 x 32 image is one vision patch grid of (32 / 8)^2 = 16 patches, which the connector's
pixel shuffle (scale_factor 2) folds into 16 / 2^2 = 4 image tokens: Idefics3Processor writes
`<fake_token_around_image><global-img>` + 4 x `<image>` + `<fake_token_around_image>` for it
(processing_idefics3.py, _prompt_single_image). initializer_range 0.2 for the language model,
as tests/helpers/lora_base.py explains: adapters on a from-scratch base at 0.02 barely move it.

The colour task: solid-colour images, "What colour is this?" -> the colour's name.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

# Idefics3's image tokens (processing_idefics3.py Idefics3Processor.__init__), added to the byte tokenizer
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
IMAGE_SIZE = 32  # px: the vision tower's image_size, and the processor's longest edge
PATCH = 8
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // 2**2  # 4 tokens per image (see the module docstring)

# A chat template of our own in Idefics3's layout ("User:<image> question<end_of_utterance>\nAssistant: ...").
# Content is a string or a list of {"type": "image"} / {"type": "text", "text": ...} parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | capitalize }}:"
    "{% if m['content'] is string %}{{ ' ' + m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}{{ ' ' + p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30)}
QUESTION = "What colour is this?"


def vision_plan(method: str = "lora", train_tower: bool = False) -> dict:
    """The vision.* a plan of the tiny base holds (plan/vision_settings.py), for hand-built plans (apply_plans.cpu_plan)."""
    tower, projector = ("model.vision_model",), ("model.connector",)
    frozen = () if train_tower else (*tower, *projector) if method != "full" else tower
    return {
        "vision.image_size": IMAGE_SIZE,
        "vision.images_per_example": 1,
        "vision.train_tower": train_tower,
        "vision.family": "idefics3",
        "vision.image_tokens": IMAGE_SEQ_LEN + 3,  # <fake_token_around_image><global-img>, the tokens, <fake_token_around_image>
        "vision.image_token_id": 261,
        "vision.tower_modules": tower,
        "vision.projector_modules": projector,
        "vision.language_model_modules": ("model.text_model", "lm_head"),
        "vision.frozen_modules": frozen,
        "vision.lora_exclude": "(" + "|".join(re.escape(p) for p in frozen) + r")(\..*)?" if frozen and method != "full" else None,
    }


def processor():
    """Idefics3Processor over the byte-level tokenizer: 4 image tokens per image, no tiling."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    tok = byte_level_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tok.eos_token = "<end_of_utterance>"  # the end of a turn, as SmolVLM's tokenizer has it
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE}, do_image_splitting=False
    )
    return Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)


def config(tokenizer):
    from transformers import Idefics3Config

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in IMAGE_TOKENS}
    return Idefics3Config(
        text_config=dict(
            model_type="llama",
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=ids["<end_of_utterance>"],
            pad_token_id=tokenizer.pad_token_id,
            initializer_range=0.2,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH
        ),
        image_token_id=ids["<image>"],
        scale_factor=2,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_base(directory: Path, seed: int = 0) -> str:
    """The tiny Idefics3 (random weights, seeded) and its processor saved in `directory`; returns it."""
    import torch
    from transformers import Idefics3ForConditionalGeneration

    torch.manual_seed(seed)
    proc = processor()
    model = Idefics3ForConditionalGeneration(config(proc.tokenizer))
    model.generation_config.eos_token_id = model.config.text_config.eos_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    proc.save_pretrained(directory)
    return str(directory)


def solid_image(path: Path, colour: str, size: int = 20, jitter: int = 0, seed: int = 0) -> Path:
    """A PNG of one colour (each channel moved by up to `jitter`, seeded)."""
    from PIL import Image

    rnd = random.Random(seed)
    rgb = tuple(max(0, min(255, c + rnd.randint(-jitter, jitter))) for c in COLOURS[colour])
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), rgb).save(path)
    return path


def colour_rows(directory: Path, per_colour: int = 8, name: str = "colours.jsonl") -> Path:
    """A chat .jsonl of image rows (paths relative to it) and their PNGs under images/; returns it."""
    rows = []
    for c in COLOURS:
        for i in range(per_colour):
            rel = f"images/{c}-{i}.png"
            solid_image(directory / rel, c, size=16 + 4 * (i % 4), jitter=20, seed=100 * list(COLOURS).index(c) + i)
            rows.append(
                {
                    "messages": [
                        {"role": "user", "content": [{"type": "image", "path": rel}, {"type": "text", "text": QUESTION}]},
                        {"role": "assistant", "content": c},
                    ]
                }
            )
    random.Random(0).shuffle(rows)
    path = directory / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def png_bytes(colour: str, size: int = 20, jitter: int = 0, seed: int = 0) -> bytes:
    """solid_image's PNG, encoded in memory: what a Hub image dataset's images column holds."""
    import io

    from PIL import Image

    rnd = random.Random(seed)
    rgb = tuple(max(0, min(255, c + rnd.randint(-jitter, jitter))) for c in COLOURS[colour])
    out = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(out, format="PNG")
    return out.getvalue()


def image_row(question: str, answer: str, images: list) -> dict:
    """A row in the Hub image datasets' layout (HuggingFaceH4/llava-instruct-mix-vsft): every content a list of parts,
    one {"type": "image"} placeholder per entry of `images` ({"bytes", "path"} structs, datasets' Image storage)."""
    parts = [{"type": "image", "text": None} for _ in images]
    return {
        "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": question}]},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ],
        "images": images,
    }


def colour_table_rows(per_colour: int = 8) -> list[dict]:
    """colour_rows' task as Hub image dataset rows, the images as PNG bytes in the rows."""
    rows = []
    for c in COLOURS:
        for i in range(per_colour):
            png = png_bytes(c, size=16 + 4 * (i % 4), jitter=20, seed=100 * list(COLOURS).index(c) + i)
            rows.append(image_row(QUESTION, c, [{"bytes": png, "path": f"{c}-{i}.png"}]))
    random.Random(0).shuffle(rows)
    return rows


def write_parquet(path: Path, rows: list[dict]) -> Path:
    """`rows` as one parquet file (pyarrow infers the columns: images as struct<bytes: binary, path: string>)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# The colour task's spec (tests/apply/test_vision_apply.py, test_vision_hub_data.py): a LoRA on the tiny VLM's
# language model; {data_source} is the [data] line naming the rows (local files or a Hub dataset).
COLOUR_SPEC = """\
[model]
name_or_path = "{base}"
method = "lora"

[lora]
r = 8
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]

[vision]
image_size = 32

[hardware]
gpu = "cpu"

[data]
{data_source}
format = "chat"
seq_len = 56

[training]
effective_batch_size = 8
learning_rate = 3e-2
max_steps = {steps}
logging_steps = 1
save_steps = 1000
seed = 0

[output]
dir = "{out}"
"""
