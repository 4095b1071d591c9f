"""A Hub image dataset as a vision-language model's training data: parquet rows whose images are PNG bytes
in an images column (datasets' Image feature), in a Hugging Face cache of huggingface_hub's own layout,
trained for real on CPU by `gpuplan apply` offline, nothing downloaded. Bad rows are refused before
anything is written, by the same reader the plan checks them with (spec/parquet_images.py)."""

from __future__ import annotations

import json

import pytest

from gpuplan.apply.errors import ApplyError
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.hub_cache import add_repo, run_cli, worker_cache
from tests.helpers.vlm_base import COLOUR_SPEC, QUESTION, colour_table_rows, image_row, png_bytes, vision_plan, write_parquet

pytest.importorskip("PIL")
pytest.importorskip("pyarrow")

CARD = b"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n# colours\n"


def hub_parquet(tmp_path, rows) -> bytes:
    """`rows` written by `datasets` with its Image feature for the images column, as the Hub's image datasets are."""
    import datasets

    ds = datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image()))
    path = tmp_path / "built" / "train.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(path))
    return path.read_bytes()


@pytest.mark.slow
def test_apply_trains_on_a_cached_hub_image_dataset_offline(tmp_path, tiny_vlm):
    rows = colour_table_rows(per_colour=4)
    shards = hub_parquet(tmp_path / "a", rows[:8]), hub_parquet(tmp_path / "b", rows[8:])  # two shards of one split: both are read
    cache = worker_cache()
    add_repo(
        cache,
        "acme/colours",
        {"README.md": CARD, "data/train-00000-of-00002.parquet": shards[0], "data/train-00001-of-00002.parquet": shards[1]},
        repo_type="dataset",
    )
    spec = tmp_path / "colours.toml"
    spec.write_text(COLOUR_SPEC.format(base=tiny_vlm, data_source='dataset = "acme/colours"', out=tmp_path / "run", steps=12))
    repo = cache / "datasets--acme--colours"
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    r = run_cli(["apply", str(spec), "--yes"], cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before  # offline: nothing fetched, nothing added
    state = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())
    results = state["results"]
    assert results["train_loss_last"] < results["train_loss_first"], results
    checks = {c["key"]: c for stage in results["audit"]["checked"].values() for c in stage}
    assert not results["audit"]["differed"]
    assert checks["vision.image_tokens"]["live"] == checks["vision.image_tokens"]["planned"] == 7
    assert checks["data.collator"]["live"] == "ImageTextCollator"
    d = run_cli(["data", str(spec), "--json", "-n", "1"], cache, cwd=tmp_path)
    assert d.returncode == 0, d.stderr[-2000:]
    stats = json.loads(d.stdout)["stats"]
    assert stats["rows"] == stats["examples"] == 16 and stats["images"] == 16  # both shards, every row, every image


def _plan(tmp_path, data, **extra):
    return cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": str(tmp_path / "base"),
            "model.from_scratch": False,
            "data.train_files": [str(data)],
            "data.format": "chat",
            "data.packing": False,
            "data.seq_len": 56,
            "output.dir": str(tmp_path / "run"),
            **vision_plan(),
            **extra,
        },
    )


def _img(colour: str = "red") -> dict:
    return {"bytes": png_bytes(colour), "path": None}


@pytest.mark.parametrize(
    ("images", "said"),
    [
        ([None], r"1 is null \(row 1: images\[0\]\)"),
        ([{"bytes": None, "path": None}], r'1 has neither "bytes" nor "path" \(row 1: images\[0\]\)'),
        ([{"bytes": b"\x89PNG\r\n\x1a\nbroken", "path": "x.png"}], r"1 cannot be decoded as an image \(row 1: images\[0\]\)"),
    ],
    ids=["null", "empty", "corrupt"],
)
def test_apply_refuses_bad_image_entries_before_anything_is_written(tmp_path, images, said):
    from gpuplan.apply.data.vision import check_before_run

    data = write_parquet(tmp_path / "train.parquet", [image_row(QUESTION, "red", [_img()]), image_row(QUESTION, "x", images)])
    with pytest.raises(ApplyError, match=rf"data.train_files: 1 of 2 images in .*train.parquet cannot be used: {said}") as e:
        check_before_run(_plan(tmp_path, data))
    assert "images column" in e.value.diagnostics[0].fix
    assert not (tmp_path / "run").exists()


def test_apply_refuses_rows_whose_placeholders_and_images_differ(tmp_path):
    from gpuplan.apply.data.vision import rows_of

    rows = [image_row(QUESTION, "red", [_img()]), image_row(QUESTION, "x", [_img(), _img()])]
    rows[1]["images"] = [_img()]
    data = write_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(ApplyError, match=r"data.train_files: 1 of 2 rows of .* \(row 1: 2 image parts, 1 image\)") as e:
        rows_of(str(data), "data.train_files", "messages")
    assert 'per {"type": "image"} part' in e.value.diagnostics[0].fix


def test_apply_refuses_placeholders_without_an_images_column(tmp_path):
    from gpuplan.apply.data.vision import rows_of

    row = image_row(QUESTION, "red", [_img()])
    row["pixels"] = row.pop("images")
    data = write_parquet(tmp_path / "train.parquet", [row])
    with pytest.raises(ApplyError, match=r"data.train_files: 1 of 1 rows .* no 'images' or 'image' column") as e:
        rows_of(str(data), "data.train_files", "messages")
    assert 'add an "images" column' in e.value.diagnostics[0].fix


def test_rows_carry_the_png_bytes_to_the_processor(tmp_path):
    from gpuplan.apply.data.vision import open_images, rows_of

    data = write_parquet(tmp_path / "train.parquet", [image_row(QUESTION, "blue", [_img("blue")])])
    (row,) = rows_of(str(data), "data.train_files", "messages")
    assert row.messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": QUESTION}]
    assert row.images == [{"bytes": png_bytes("blue"), "path": None}]
    (im,) = open_images(row.images)
    assert im.size == (20, 20) and im.getpixel((3, 3)) == (30, 40, 220)
