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


# ---- parquet rows: the Hub image datasets' layout (spec/parquet_images.py) ----------------------


def _parquet(tmp_path, rows, name="train.parquet") -> str:
    from tests.helpers.vlm_base import write_parquet

    pytest.importorskip("pyarrow")
    return str(write_parquet(tmp_path / name, rows))


def _img(colour="red", size=20) -> dict:
    from tests.helpers.vlm_base import png_bytes

    return {"bytes": png_bytes(colour, size), "path": None}


def test_parquet_images_null_empty_and_undecodable_are_counted_with_their_rows(tmp_path):
    from tests.helpers.vlm_base import QUESTION, image_row

    broken = {"bytes": b"\x89PNG\r\n\x1a\n not really a png", "path": "x.png"}
    rows = [image_row(QUESTION, "red", [_img()]), image_row(QUESTION, "x", [None]), image_row(QUESTION, "x", [broken])]
    rows += [image_row(QUESTION, "x", [_img(), {"bytes": None, "path": None}]), image_row(QUESTION, "x", [None])]
    path = _parquet(tmp_path, rows)
    diags = image_row_problems(_values(path), vision_family="idefics3", model_type="idefics3", model_dir=None)
    by = {d.summary.split(": ", 2)[2].split(" (rows")[0]: d for d in diags}
    assert set(by) == {"is null", 'has neither "bytes" nor "path"', "cannot be decoded as an image"}, by
    null = by["is null"]
    assert null.severity == "error" and null.key == "data.train_files[0]"
    assert null.summary == f"data.train_files[0]: 2 of 6 images in {path}: is null (rows 1, 4)"
    assert "(rows 3)" in by['has neither "bytes" nor "path"'].summary and "(rows 2)" in by["cannot be decoded as an image"].summary
    assert "datasets' Image feature" in null.detail and "the image's encoded bytes" in null.fix


def test_parquet_images_over_the_limit_are_said_to_be_resized(tmp_path):
    from tests.helpers.vlm_base import QUESTION, image_row

    model = tmp_path / "model"
    model.mkdir()
    (model / "processor_config.json").write_text(json.dumps({"image_processor": {"size": {"longest_edge": 32}}}))
    path = _parquet(tmp_path, [image_row(QUESTION, "red", [_img("red", 20)]), image_row(QUESTION, "blue", [_img("blue", 40)])])
    (d,) = image_row_problems(_values(path), vision_family="idefics3", model_type="idefics3", model_dir=str(model))
    assert d.severity == "note" and "1 of 2 images" in d.summary and "40 x 40 px" in d.summary


def test_parquet_rows_whose_placeholders_and_images_differ_are_an_error(tmp_path):
    from tests.helpers.vlm_base import QUESTION, image_row

    rows = [image_row(QUESTION, "red", [_img()]), image_row(QUESTION, "x", [_img(), _img()]), image_row(QUESTION, "x", [])]
    rows[1]["images"] = [_img()]
    rows[2]["images"] = [_img()]
    path = _parquet(tmp_path, rows)
    (d,) = image_row_problems(_values(path), vision_family="idefics3", model_type="idefics3", model_dir=None)
    assert d.severity == "error" and d.key == "data.train_files[0]"
    assert "2 of 3 rows" in d.summary and "row 1: 2 image parts, 1 image; row 2: 0 image parts, 1 image" in d.summary
    assert 'one entry in its "images" column per {"type": "image"} part' in d.fix


def test_parquet_placeholders_without_an_images_column_are_an_error(tmp_path):
    from tests.helpers.vlm_base import QUESTION, image_row

    row = image_row(QUESTION, "red", [_img()])
    del row["images"]
    (d,) = image_row_problems(_values(_parquet(tmp_path, [row])), vision_family="idefics3", model_type="idefics3", model_dir=None)
    assert d.severity == "error" and "no 'images' or 'image' column" in d.summary and "'messages'" in d.summary
    assert 'add an "images" column' in d.fix


def _bad(kind: str) -> list[dict]:
    from tests.helpers.vlm_base import QUESTION, image_row

    rows = [image_row(QUESTION, "red", [_img()]), image_row(QUESTION, "x", [_img()])]
    if kind == "null":
        rows[1]["images"] = [None]
    elif kind == "empty":
        rows[1]["images"] = [{"bytes": None, "path": None}]
    elif kind == "mismatch":
        rows[1]["images"] = [_img(), _img()]
    else:  # no images column
        for r in rows:
            r["pictures"] = r.pop("images")
    return rows


@pytest.mark.parametrize(
    ("kind", "said", "fix"),
    [
        ("null", "1 of 2 images in {data}: is null (rows 1)", "the image's encoded bytes"),
        ("empty", '1 of 2 images in {data}: has neither "bytes" nor "path" (rows 1)', "the image's encoded bytes"),
        ("mismatch", "(row 1: 1 image part, 2 images)", 'one entry in its "images" column per {{"type": "image"}} part'),
        ("no-column", "no 'images' or 'image' column to take them from (its columns: 'messages', 'pictures')", 'add an "images" column'),
    ],
)
def test_plan_of_bad_parquet_images_exits_1_naming_the_key_and_the_fix(tmp_path, capsys, kind, said, fix):
    from gpuplan.cli.main import main

    data = _parquet(tmp_path, _bad(kind))
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[model]\nconfig = "{REPO / "specs" / "models" / "qwen2.5-vl-7b.json"}"\nmethod = "qlora"\n[vision]\nimage_size = 448\n'
        f'[hardware]\ngpu = "RTX-4090"\n[data]\ntrain_files = ["{data}"]\nformat = "chat"\nchat_template = "chatml"\nseq_len = 1024\n'
        f'[training]\neffective_batch_size = 8\n[output]\ndir = "{tmp_path / "run"}"\n'
    )
    assert main(["plan", str(spec)]) == 1
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "Error: data.train_files[0]: " in text and said.format(data=data) in text, text
    assert "fix: " in text and fix.format() in text and "Traceback" not in text
    assert not (tmp_path / "run").exists()


# ---- a Hub image dataset, from the cache ---------------------------------------------------------

CARD = b"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n# colours\n"


def _hub_spec(tmp_path, monkeypatch, files: dict[str, bytes] | None) -> str:
    """A spec of the Qwen2.5-VL config on data.dataset = "acme/colours", whose cache holds the card and `files`."""
    import huggingface_hub.constants

    from tests.helpers.hub_cache import add_repo

    cache = tmp_path / "cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    add_repo(cache, "acme/colours", {"README.md": CARD, **(files or {})}, repo_type="dataset")
    return (
        f'[model]\nconfig = "{REPO / "specs" / "models" / "qwen2.5-vl-7b.json"}"\nmethod = "qlora"\n[vision]\nimage_size = 448\n'
        '[hardware]\ngpu = "RTX-4090"\n[data]\ndataset = "acme/colours"\nformat = "chat"\nchat_template = "chatml"\nseq_len = 1024\n'
        "[training]\neffective_batch_size = 8\n"
    )


def test_a_cached_hub_image_dataset_is_checked_as_local_parquet(tmp_path, monkeypatch):
    from gpuplan.plan.types import PlanError
    from tests.helpers.planning import plan_text
    from tests.helpers.vlm_base import QUESTION, image_row

    rows = [image_row(QUESTION, "red", [_img()]), image_row(QUESTION, "x", [_img(), None]), image_row(QUESTION, "x", [None])]
    parquet = open(_parquet(tmp_path / "built", rows), "rb").read()
    spec = _hub_spec(tmp_path, monkeypatch, {"data/train-00000-of-00001.parquet": parquet, "data/test-00000-of-00001.parquet": parquet})
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec)
    (d,) = [d for d in e.value.diagnostics if d.severity == "error"]
    assert d.key == "data.dataset" and "2 of 4 images in " in d.summary and "is null (rows 1, 2)" in d.summary
    assert "train-00000-of-00001.parquet: is null" in d.summary and "/data/test-" not in d.summary  # the split's file only


def test_a_hub_image_dataset_whose_files_are_not_cached_is_left_to_apply_with_a_note(tmp_path, monkeypatch):
    from tests.helpers.planning import plan_text

    plan = plan_text(tmp_path, _hub_spec(tmp_path, monkeypatch, None))
    (d,) = [d for d in plan.diagnostics if d.key == "data.dataset"]
    assert d.severity == "note" and "not in the cache" in d.summary and "checked by apply" in d.summary
    assert d.fix.startswith("hf download acme/colours --revision ") and "--repo-type dataset" in d.fix


def test_a_hub_models_cached_processor_sets_the_resize_limit(tmp_path, monkeypatch):
    """model.name_or_path a Hub id: the processor files in its cached snapshot give the limit, as a local directory's do."""
    import huggingface_hub.constants

    from tests.helpers.hub_cache import add_repo
    from tests.helpers.planning import plan_text
    from tests.helpers.vlm_base import QUESTION, image_row

    cache = tmp_path / "cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    config = (REPO / "specs" / "models" / "qwen2.5-vl-7b.json").read_bytes()
    add_repo(cache, "acme/vl", {"config.json": config, "preprocessor_config.json": json.dumps({"max_pixels": 1000}).encode()})
    data = _parquet(tmp_path, [image_row(QUESTION, "red", [_img("red", 20)]), image_row(QUESTION, "blue", [_img("blue", 40)])])
    plan = plan_text(
        tmp_path,
        '[model]\nname_or_path = "acme/vl"\nmethod = "qlora"\n[vision]\nimage_size = 448\n[hardware]\ngpu = "RTX-4090"\n'
        f'[data]\ntrain_files = ["{data}"]\nformat = "chat"\nchat_template = "chatml"\nseq_len = 1024\n'
        "[training]\neffective_batch_size = 8\n",
    )
    (d,) = [d for d in plan.diagnostics if d.key == "data.train_files[0]"]
    assert d.severity == "note" and "1 of 2 images" in d.summary and "limit (1,000 pixels)" in d.summary and "40 x 40 px" in d.summary
