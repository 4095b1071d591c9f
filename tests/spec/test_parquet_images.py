"""Parquet image rows (spec/parquet_images.py), the Hub image datasets' layout: each {"type": "image"}
placeholder takes the next entry of the row's images column, and the image parts then carry the
PNG's bytes (spec/chat_images.py decodes them). Real parquet files (pyarrow, and datasets' own Image
feature), real PNGs (PIL); no torch."""

from __future__ import annotations

import pytest

from gpuplan.spec.chat_images import EMPTY_IMAGE, NULL_IMAGE, decode, decode_part, image_parts
from gpuplan.spec.parquet_images import ImageRowsError, Mismatch, read_image_rows
from tests.helpers.vlm_base import QUESTION, image_row, png_bytes, write_parquet

pytest.importorskip("PIL")
pytest.importorskip("pyarrow")


def test_placeholders_take_the_images_column_in_order_and_decode_from_bytes(tmp_path):
    red, blue = png_bytes("red", 20), png_bytes("blue", 30)
    images = [{"bytes": red, "path": "a.png"}, {"bytes": blue, "path": None}]
    path = write_parquet(tmp_path / "train.parquet", [image_row(QUESTION, "red then blue", images)])
    table = read_image_rows(str(path), "messages")
    assert table.mismatched == [] and table.images_column == "images"
    parts = image_parts(table.rows[0]["messages"], str(path))
    assert [(p.source, p.data, p.path) for p in parts] == [("images[0]", red, None), ("images[1]", blue, None)]
    assert [(d.width, d.height) for d in map(decode_part, parts)] == [(20, 20), (30, 30)]
    assert decode(red).width == 20  # decode takes bytes as it takes a path


def test_datasets_own_image_feature_is_read_as_bytes(tmp_path):
    """A parquet file written by `datasets` with its Image feature, as the Hub's image datasets are."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    row = image_row(QUESTION, "green", [Image.new("RGB", (12, 8), (30, 200, 40))])
    ds = datasets.Dataset.from_dict({"messages": [row["messages"]], "images": [row["images"]]}).cast_column(
        "images", datasets.Sequence(datasets.Image())
    )
    path = tmp_path / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    ds.to_parquet(str(path))
    (part,) = image_parts(read_image_rows(str(path), "messages").rows[0]["messages"], str(path))
    assert part.source == "images[0]" and part.data is not None and part.data.startswith(b"\x89PNG")
    assert (decode_part(part).width, decode_part(part).height) == (12, 8)


def test_null_empty_and_path_entries(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "ok.png").write_bytes(png_bytes("yellow", 10))
    rows = [
        image_row(QUESTION, "x", [None]),
        image_row(QUESTION, "x", [{"bytes": None, "path": None}]),
        image_row(QUESTION, "x", [{"bytes": None, "path": "img/ok.png"}]),  # relative to the parquet file, as paths of .jsonl rows
        image_row(QUESTION, "x", [{"bytes": b"\x89PNG\r\n\x1a\n not a png", "path": "bad.png"}]),
    ]
    path = str(write_parquet(tmp_path / "rows.parquet", rows))
    found = [decode_part(p) for r in read_image_rows(path, "messages").rows for p in image_parts(r["messages"], path)]
    assert [d.problem for d in found[:2]] == [NULL_IMAGE, EMPTY_IMAGE]
    assert (found[2].width, found[2].problem) == (10, None)
    assert found[3].problem is not None and found[3].problem.startswith("cannot be decoded as an image")


def test_rows_whose_placeholders_and_images_differ_are_listed_not_matched(tmp_path):
    img = {"bytes": png_bytes("red"), "path": None}
    rows = [image_row(QUESTION, "ok", [img]), image_row(QUESTION, "two parts", [img, img]), image_row(QUESTION, "ok", [img])]
    rows[1]["images"] = [img]  # two placeholders, one image
    table = read_image_rows(str(write_parquet(tmp_path / "rows.parquet", rows)), "messages")
    assert table.mismatched == [Mismatch(1, 2, 1)]
    assert [p.source for p in image_parts(table.rows[1]["messages"], str(tmp_path))] == [None, None]  # left unmatched


def test_placeholders_without_an_images_column_are_refused_with_the_fix(tmp_path):
    rows = [image_row(QUESTION, "red", [{"bytes": png_bytes("red"), "path": None}])]
    rows[0]["pictures"] = rows[0].pop("images")
    path = write_parquet(tmp_path / "rows.parquet", rows)
    with pytest.raises(ImageRowsError, match=r"1 of 1 rows of .*rows.parquet hold .* no 'images' or 'image' column .*'pictures'") as e:
        read_image_rows(str(path), "messages")
    assert e.value.fix is not None and 'add an "images" column' in e.value.fix


def test_a_single_image_column_stands_for_a_list_of_one(tmp_path):
    row = image_row(QUESTION, "blue", [None])
    del row["images"]
    row["image"] = {"bytes": png_bytes("blue", 14), "path": "b.png"}
    path = str(write_parquet(tmp_path / "vqa.parquet", [row]))
    (part,) = image_parts(read_image_rows(path, "messages").rows[0]["messages"], path)
    assert part.source == "image" and decode_part(part).width == 14


def test_turns_without_roles_are_refused_with_the_conversion(tmp_path):
    """HuggingFaceM4/the_cauldron's layout: `texts` of {user, assistant, source} turns, with no part placing the images."""
    row = {"images": [{"bytes": png_bytes("red"), "path": None}], "texts": [{"user": QUESTION, "assistant": "red", "source": "x"}]}
    path = write_parquet(tmp_path / "cauldron.parquet", [row])
    with pytest.raises(
        ImageRowsError, match=r"data.messages_field = 'texts': row 0 of .* holds its chat as \{'user', 'assistant', 'source'\} turns"
    ):
        read_image_rows(str(path), "texts")


PLAIN = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}, {"role": "assistant", "content": "red"}]


def _plain_row_read(tmp_path) -> tuple[str, list]:
    row = {"messages": PLAIN, "images": [{"bytes": png_bytes("red"), "path": None}, {"bytes": png_bytes("blue"), "path": None}]}
    path = str(write_parquet(tmp_path / "plain.parquet", [row]))
    return path, read_image_rows(path, "messages").rows[0]["messages"]


def test_text_messages_get_the_images_at_the_start_of_the_first_user_turn(tmp_path):
    path, read = _plain_row_read(tmp_path)
    parts = image_parts(read, path)
    assert [p.data for p in parts] == [png_bytes("red"), png_bytes("blue")] and [p.message for p in parts] == [1, 1]
    assert read[1]["content"][-1] == {"type": "text", "text": QUESTION} and read[0] == PLAIN[0] and read[2] == PLAIN[2]


@pytest.mark.slow
def test_text_messages_get_their_images_where_trl_places_them(tmp_path):
    """The same row through TRL's own placing (importing trl takes seconds)."""
    from trl.data_utils import prepare_multimodal_messages

    _, read = _plain_row_read(tmp_path)
    trl = prepare_multimodal_messages(PLAIN, images=["a", "b"])
    assert [[p["type"] for p in m["content"]] for m in trl[1:2]] == [[p["type"] for p in read[1]["content"]]]
