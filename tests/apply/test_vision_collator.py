"""The vision-language collator's labels against the processor's own special tokens (apply/data/vision.py).

A real Idefics3Processor (tests/helpers/vlm_base.py) turns a chat row with an image into ids; only the
assistant's answer is trained: never an image token (image_token_id, fake_image_token_id,
global_image_token_id), never padding, never the prompt, even under data.train_on_prompt for the images."""

from __future__ import annotations

import pytest

from tests.helpers.apply_plans import cpu_plan
from tests.helpers.vlm_base import colour_rows, vision_plan

pytest.importorskip("PIL")
pytestmark = pytest.mark.slow  # the tiny VLM is built and transformers imported: ~6 s and more


def _plan(tmp_path, base, data, **extra):
    return cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": base,
            "model.from_scratch": False,
            "data.train_files": [str(data)],
            "data.format": "chat",
            "data.packing": False,
            "data.seq_len": 64,
            **vision_plan(),
            **extra,
        },
    )


def _batch(tmp_path, tiny_vlm, **extra):
    from gpuplan.apply.data.vision import load_processor, prepare_vision

    data = colour_rows(tmp_path / "data", per_colour=1)
    processor = load_processor(tiny_vlm)
    prepared = prepare_vision(_plan(tmp_path, tiny_vlm, data, **extra), processor)
    rows = [prepared.train[i] for i in range(2)]
    return processor, rows, prepared.collator(rows)


def test_labels_keep_only_the_answer_never_image_pad_or_prompt_tokens(tmp_path, tiny_vlm):
    import torch

    processor, rows, batch = _batch(tmp_path, tiny_vlm)
    tok = processor.tokenizer
    image_ids = {processor.image_token_id, processor.fake_image_token_id, processor.global_image_token_id}
    assert len(image_ids) == 3 and tok.unk_token_id not in image_ids
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == (2, 64) and batch["pixel_values"].shape[:2] == (2, 1)
    for row in range(2):
        # the ids are the processor's own for the whole rendered row and its image
        alone = processor(text=[rows[row]["text"]], images=[[_image(rows[row])]], add_special_tokens=False)["input_ids"][0]
        assert ids[row, : len(alone)].tolist() == alone and int(mask[row].sum()) == len(alone)
        assert sum(1 for t in alone if t == processor.image_token_id) == 4  # image_seq_len
        kept = labels[row][labels[row] != -100]
        assert tok.decode(kept) in {f" {c}<end_of_utterance>\n" for c in ("red", "green", "blue", "yellow")}
        assert not torch.isin(kept, torch.tensor(sorted(image_ids))).any()
        assert (labels[row][mask[row] == 0] == -100).all()  # padding


def test_train_on_prompt_trains_the_prompt_text_but_never_the_image_tokens(tmp_path, tiny_vlm):
    import torch

    processor, _, batch = _batch(tmp_path, tiny_vlm, **{"data.train_on_prompt": True})
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    image = torch.isin(ids, torch.tensor([processor.image_token_id, processor.fake_image_token_id, processor.global_image_token_id]))
    assert image.sum() == 2 * 7  # 4 <image>, two <fake_token_around_image>, one <global-img> per image
    assert (labels[image] == -100).all()
    assert ((labels != -100) == (mask.bool() & ~image)).all()  # every other real token is trained


def _image(row):
    from gpuplan.apply.data.vision import open_images

    return open_images(list(row["images"]))[0]
