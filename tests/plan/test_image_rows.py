"""Images in chat rows checked at plan time (plan/checks/image_rows.py): a text model refuses them,
missing and undecodable images are counted with their rows, images over the processor's limit are said
to be resized. Real files, real PIL; no torch."""

from __future__ import annotations

import json

import pytest

from gpuplan.plan.checks.image_rows import ImageLimit, image_limit, image_row_problems
from tests.helpers.apply_plans import REPO

PIL = pytest.importorskip("PIL.Image")


def _row(*images: str) -> dict:
    parts = [{"type": "image", "path": p} for p in images]
    return {
        "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": "What colour?"}]},
            {"role": "assistant", "content": "red"},
        ]
    }


def _data(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _png(path, size=(20, 20)):
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.new("RGB", size, (200, 10, 10)).save(path)


def _values(path: str) -> dict:
    return {"data.format": "chat", "data.messages_field": "messages", "data.train_files": [path], "training.objective": "sft"}


def test_missing_and_corrupt_images_are_counted_with_their_rows(tmp_path):
    _png(tmp_path / "img" / "ok.png")
    (tmp_path / "img" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    rows = [_row("img/ok.png"), _row("img/gone.png"), _row("img/broken.png"), _row("img/gone2.png", "img/ok.png")]
    diags = image_row_problems(_values(_data(tmp_path, rows)), vision_family="idefics3", model_type="idefics3", model_dir=None)
    by = {d.summary.split(" (rows")[0]: d for d in diags}
    missing = next(d for s, d in by.items() if "no such file" in s)
    corrupt = next(d for s, d in by.items() if "cannot be decoded" in s)
    assert all(d.severity == "error" and d.key == "data.train_files[0]" for d in (missing, corrupt))
    assert "2 of 5 images" in missing.summary and "(rows 1, 3)" in missing.summary
    assert "1 of 5 images" in corrupt.summary and "(rows 2)" in corrupt.summary
    assert "relative to the data file" in missing.detail


def test_a_text_model_refuses_image_parts_with_the_fix(tmp_path):
    _png(tmp_path / "img" / "ok.png")
    path = _data(tmp_path, [_row("img/ok.png"), {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}])
    (d,) = image_row_problems(_values(path), vision_family=None, model_type="llama", model_dir=None)
    assert d.severity == "error" and "1 of 2 rows" in d.summary and "model llama reads no images" in d.summary
    assert "vision-language model" in d.fix


def test_images_over_the_processor_limit_are_said_to_be_resized(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "processor_config.json").write_text(json.dumps({"image_processor": {"size": {"longest_edge": 32}}}))
    _png(tmp_path / "img" / "small.png", (20, 20))
    _png(tmp_path / "img" / "big.png", (64, 48))
    path = _data(tmp_path, [_row("img/small.png"), _row("img/big.png")])
    assert image_limit(str(model), "idefics3") == ImageLimit(longest_edge=32)
    (d,) = image_row_problems(_values(path), vision_family="idefics3", model_type="idefics3", model_dir=str(model))
    assert d.severity == "note"
    assert "1 of 2 images" in d.summary and "a longest side of 32 px" in d.summary and "64 x 48 px" in d.summary


def test_qwen_limits_are_pixel_counts(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 12845056, "min_pixels": 3136}))
    limit = image_limit(str(tmp_path), "qwen2_vl")
    assert limit == ImageLimit(max_pixels=12845056)
    assert not limit.exceeded_by(3000, 3000) and limit.exceeded_by(4000, 4000)


def test_plan_refuses_image_rows_for_a_text_model(tmp_path, capsys):
    from gpuplan.cli.main import main

    _png(tmp_path / "img" / "ok.png")
    data = _data(tmp_path, [_row("img/ok.png")] * 3)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[model]\nconfig = "{REPO / "specs" / "models" / "llama-160m.json"}"\nfrom_scratch = true\n'
        f'[hardware]\ngpu = "A100-80GB"\n[data]\ntrain_files = ["{data}"]\nformat = "chat"\nchat_template = "chatml"\nseq_len = 128\n'
        f'[output]\ndir = "{tmp_path / "run"}"\n'
    )
    assert main(["plan", str(spec)]) == 1
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "3 of 3 rows" in text and "reads no images" in text and "Traceback" not in text
    assert not (tmp_path / "run").exists()
