"""Chat rows with images -> the processor's inputs with labels, and the collator that batches them.

A vision-language model reads text through its processor (transformers' AutoProcessor: an image
processor, the tokenizer and the chat template), which writes each image placeholder of the
rendered text as the image's tokens (Idefics3: `<fake_token_around_image><global-img>` + N x
`<image>` + `<fake_token_around_image>`; Qwen2-VL: `<|vision_start|>` + N x `<|image_pad|>` +
`<|vision_end|>`) and turns the images into pixel_values.

Each row is rendered with the processor's chat template and split into masked and trained
segments as text rows are (chat.py conversation_segments: the assistant turns, unless
data.train_on_prompt). Every segment is tokenized by the processor with its own images, so the
image tokens land in the segment that holds the image; the collator then runs the processor on
the whole row once more (the ids the model sees) and refuses a row whose ids differ from the
segments' (the segment flags would not line up). The labels keep a token only when it is trained,
is not padding (attention_mask 0), and is none of the processor's image tokens
(`image_token_ids`): an image token is an input, never a target, even under train_on_prompt.

Rows are read as JSON, not by `datasets`' json builder: a user turn's content is a list of parts
and an assistant's often a string, a column Arrow cannot type. Parquet rows (a Hub image dataset's
files, or local ones) are read by spec/parquet_images.py, the plan's reader too: their images are
the encoded bytes of an images column, matched in order to the {"type": "image"} placeholders.
Each image is carried as datasets' Image storage, {"bytes": ..., "path": ...} (bytes first).
Rows longer than data.seq_len are refused, not cut: a cut through an image's tokens leaves the model fewer tokens than image
features, which it refuses (modeling_idefics3.py inputs_merger, Qwen2-VL get_placeholder_mask).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from gpuplan.apply.data.chat import IGNORE_INDEX, chat_template_of, conversation_segments
from gpuplan.apply.errors import ApplyError
from gpuplan.plan.types import Plan
from gpuplan.spec.chat_images import ImagePart, decode_part, image_parts, is_image_part
from gpuplan.spec.parquet_images import MISMATCH_FIX, ImageRowsError, describe_mismatches, is_parquet, read_image_rows

JSON_SUFFIXES = (".jsonl", ".json")
ROW_SUFFIXES = (*JSON_SUFFIXES, ".parquet")
SHOWN_ROWS = 5


def load_processor(model_dir: str | None, trust_remote_code: bool = False) -> Any:
    """The model directory's AutoProcessor (local files only); its tokenizer gets a pad token if it has none."""
    from transformers import AutoProcessor

    if model_dir is None:
        raise ApplyError("model.name_or_path is not set: a vision-language model loads its processor from it", key="model.name_or_path")
    try:
        proc = AutoProcessor.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise ApplyError(
            f"model.name_or_path: cannot load the processor in {model_dir}: {e}",
            key="model.name_or_path",
            fix="a vision-language model directory holds its processor (processor_config.json or preprocessor_config.json, "
            "the tokenizer files and the chat template); copy them from the pretrained model",
        ) from e
    tok = getattr(proc, "tokenizer", None)
    if tok is None or not hasattr(proc, "image_processor"):
        raise ApplyError(
            f"model.name_or_path: the processor in {model_dir} ({type(proc).__name__}) has no image processor and tokenizer",
            key="model.name_or_path",
        )
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ApplyError(
                f"model.name_or_path: the tokenizer in {model_dir} has neither a pad nor an eos token", key="model.name_or_path"
            )
        tok.pad_token = tok.eos_token  # labels mask padding by attention_mask, so eos stays trained
    return proc


def image_token_ids(processor: Any, model_config: Any = None) -> list[int]:
    """The ids of the tokens the processor writes for images: the processor's own `*image*_token_id`
    / `*vision*` / `*video*` attributes (Idefics3Processor: image_token_id, fake_image_token_id,
    global_image_token_id; Qwen2VLProcessor: image_token_id, video_token_id) and the model config's
    (image_token_id / image_token_index, vision_start_token_id, vision_end_token_id, video_token_id)."""
    ids: set[int] = set()

    def take(obj: Any) -> None:
        for name in dir(obj):
            if not name.endswith(("_token_id", "_token_index")) or not any(w in name for w in ("image", "vision", "video")):
                continue
            try:
                value = getattr(obj, name)
            except Exception:  # noqa: BLE001 - a property that needs what this processor lacks
                continue
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                ids.add(value)

    take(processor)
    for value in getattr(processor, "row_col_ids", None) or []:  # Idefics3's <row_i_col_j> tile markers
        if isinstance(value, int) and value >= 0:
            ids.add(value)
    if model_config is not None:
        take(model_config)
    unk = getattr(processor.tokenizer, "unk_token_id", None)
    ids.discard(unk)  # a token the tokenizer lacks converts to unk: not an image token
    return sorted(ids)


# ---- rows ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One chat row: its messages as the template reads them and its images."""

    index: int
    messages: list[dict[str, Any]]
    images: list[dict[str, Any]]  # {"bytes": encoded file or None, "path": absolute path or None}, in the order the parts appear


def image_of(part: ImagePart) -> dict[str, Any]:
    """An image part as datasets' Image storage: its bytes, else its file."""
    return {"bytes": part.data, "path": None if part.data is not None else part.path}


def read_rows(path: str, key: str, field: str = "messages") -> list[Any]:
    """The rows of a .jsonl / .json / .parquet file (parquet: placeholders filled from its images column)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in ROW_SUFFIXES:
        raise ApplyError(
            f"{key}: {path}: chat rows with images are read from .jsonl, .json or .parquet files, not {suffix!r}",
            key=key,
            fix='write the rows as JSON lines (one {"messages": [...]} per line)',
        )
    if is_parquet(path):
        try:
            table = read_image_rows(path, field)
        except ImageRowsError as e:
            raise ApplyError(f"{key}: {e.summary}", key=key, fix=e.fix) from None
        if table.mismatched:
            raise ApplyError(
                f"{key}: {describe_mismatches(table.mismatched, len(table.rows), path, SHOWN_ROWS)}", key=key, fix=MISMATCH_FIX
            )
        return table.rows
    try:
        with open(path, encoding="utf-8") as f:
            if suffix == ".jsonl":
                return [json.loads(line) for line in f if line.strip()]
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ApplyError(f"{key}: cannot read {path} as JSON: {e}", key=key) from e
    if not isinstance(data, list):
        raise ApplyError(f"{key}: {path} holds a JSON {type(data).__name__}, not a list of rows", key=key)
    return data


def _template_messages(msgs: Any, field: str, index: int) -> list[dict[str, Any]]:
    where = f"data.messages_field = {field!r}: row {index}"
    if not isinstance(msgs, list) or not msgs:
        raise ApplyError(f"{where} holds {type(msgs).__name__}, not a non-empty list of {{role, content}} messages")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApplyError(f'{where}: message {m!r} is not {{"role": str, "content": ...}}')
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if is_image_part(p):
                    parts.append({"type": "image"})  # the file is the processor's input, not the template's
                elif isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                    parts.append({"type": "text", "text": p["text"]})
                else:
                    raise ApplyError(
                        f'{where}: content part {p!r} is neither {{"type": "image", "path": ...}} nor {{"type": "text", "text": ...}}'
                    )
            if m["role"] == "assistant" and any(p["type"] == "image" for p in parts):
                raise ApplyError(f"{where}: an assistant message holds an image; images go in the user's messages (the model reads them)")
            out.append({"role": m["role"], "content": parts})
        elif isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        else:
            raise ApplyError(f"{where}: message content {content!r} is neither text nor a list of parts")
    return out


def image_problems(rows: list[Any], field: str, data_file: str, key: str) -> None:
    """Every missing or undecodable image of the split, counted and reported at once (none dropped)."""
    bad: dict[str, list[str]] = {}
    total = 0
    for i, row in enumerate(rows):
        for part in image_parts(row.get(field) if isinstance(row, dict) else None, data_file):
            total += 1
            d = decode_part(part)
            if d.problem is not None:
                bad.setdefault(d.problem.split(" (")[0], []).append(f"row {i}: {part.source or '(no path)'}")
    if not bad:
        return
    lines = []
    for problem, where in bad.items():
        shown = ", ".join(where[:SHOWN_ROWS]) + (", ..." if len(where) > SHOWN_ROWS else "")
        lines.append(f"{len(where)} {problem} ({shown})")
    fix = (
        'an images column holds one {"bytes": ..., "path": ...} struct per image part; give those entries the image\'s bytes, '
        "or remove those rows (gpuplan drops no row silently)"
        if is_parquet(data_file)
        else "image paths are relative to the data file's directory; fix or remove those rows (gpuplan drops no row silently)"
    )
    raise ApplyError(
        f"{key}: {sum(len(w) for w in bad.values())} of {total} images in {data_file} cannot be used: " + "; ".join(lines),
        key=key,
        fix=fix,
    )


def rows_of(path: str, key: str, field: str) -> list[Row]:
    raw = read_rows(path, key, field)
    if not raw:
        raise ApplyError(f"{key}: {path} has no rows", key=key)
    image_problems(raw, field, path, key)
    out = []
    for i, r in enumerate(raw):
        if not isinstance(r, dict):
            raise ApplyError(f"{key}: row {i} of {path} is not an object with fields", key=key)
        if field not in r:
            raise ApplyError(
                f"data.messages_field = {field!r}: row {i} of {path} has no such field; it has {', '.join(map(repr, r))}",
                key="data.messages_field",
            )
        parts = image_parts(r[field], path)
        out.append(Row(i, _template_messages(r[field], field, i), [image_of(p) for p in parts]))
    return out


def data_key(plan: Plan) -> str:
    """The spec key the training rows come from: a Hub dataset's, or the local files'."""
    return "data.dataset" if plan.resolved.data.dataset else "data.train_files"


def check_before_run(plan: Plan) -> None:
    """The chat rows of every file of each split, every image of them opened (PIL, no torch), before apply writes anything."""
    from gpuplan.apply.data.prepare import train_paths

    if plan.resolved.data.format != "chat":
        raise ApplyError(
            f"data.format = {plan.resolved.data.format!r}: a vision-language model trains on chat rows with image parts",
            key="data.format",
            fix='set data.format = "chat" and write each row as {"messages": [{"role": "user", "content": '
            '[{"type": "image", "path": "images/x.png"}, {"type": "text", "text": ...}]}, {"role": "assistant", "content": ...}]}',
        )
    field = plan.resolved.data.messages_field
    for key, paths in ((data_key(plan), train_paths(plan)), ("data.eval_files", list(plan.resolved.data.eval_files))):
        for path in paths:
            if not os.path.isfile(path):
                raise ApplyError(f"{key}: {path} does not exist", key=key)
            image_problems(read_rows(path, key, field), field, path, key)


def open_images(images: list[Any]) -> list[Any]:
    """PIL images (RGB) of a row's images: file paths, encoded bytes, or datasets' {"bytes", "path"} structs (bytes first)."""
    import io

    from PIL import Image

    out = []
    for image in images:
        if isinstance(image, dict):
            image = image["bytes"] if image.get("bytes") is not None else image.get("path")
        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as im:
            out.append(im.convert("RGB"))
    return out


# ---- tokens and labels ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    text: str  # the row rendered by the chat template (image placeholders unexpanded)
    input_ids: list[int]
    trained: list[bool]
    images: list[dict[str, Any]]


class RowEncoder:
    """Rows -> segments (chat.py) -> token ids with the processor, images expanded where they are."""

    def __init__(self, plan: Plan, processor: Any):
        self.processor = processor
        self.template = chat_template_of(plan, _TemplateHolder(processor))
        self.train_on_prompt = plan.resolved.data.train_on_prompt

    def render(self, msgs: list, gen: bool) -> str:
        try:
            return self.processor.apply_chat_template(msgs, chat_template=self.template, tokenize=False, add_generation_prompt=gen)
        except Exception as e:  # jinja2 TemplateError, or the template's own raise_exception
            raise ApplyError(f"data.chat_template: rendering failed: {e}") from e

    def ids(self, text: str, images: list[Any]) -> list[int]:
        if images:
            enc = self.processor(text=[text], images=[images], add_special_tokens=False)
        else:
            enc = self.processor.tokenizer([text], add_special_tokens=False)
        return list(enc["input_ids"][0])

    def encode(self, row: Row) -> Encoded:
        segments = conversation_segments(row.messages, self.render, self.train_on_prompt)
        placeholder = getattr(self.processor, "image_token", None)
        images = open_images(row.images)
        ids: list[int] = []
        trained: list[bool] = []
        used = 0
        for text, on in segments:
            n = text.count(placeholder) if placeholder else 0
            seg = self.ids(text, images[used : used + n])
            used += n
            ids += seg
            trained += [on] * len(seg)
        if used != len(images):
            raise ApplyError(
                f"data.messages_field: row {row.index} has {len(images)} image parts but its rendered text holds {used} "
                f"image placeholders ({placeholder!r}); the chat template must write one per image part",
                key="data.chat_template",
            )
        return Encoded("".join(t for t, _ in segments), ids, trained, row.images)


class _TemplateHolder:
    """The processor's chat template where chat_template_of looks for a tokenizer's."""

    def __init__(self, processor: Any):
        self.chat_template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)


def encode_split(plan: Plan, processor: Any, paths: list[str], key: str) -> Any:
    """A datasets.Dataset of the encoded rows of `paths` (text, input_ids, trained, images); refuses rows over data.seq_len."""
    import datasets

    encoder = RowEncoder(plan, processor)
    kept = [e for path in paths for e in _encode_file(plan, encoder, path, key)]
    if not kept:
        raise ApplyError(f"{key}: no row of {', '.join(paths)} has a trained token; check the assistant turns", key=key)
    return datasets.Dataset.from_dict(
        {
            "text": [e.text for e in kept],
            "input_ids": [e.input_ids for e in kept],
            "trained": [e.trained for e in kept],
            "images": [e.images for e in kept],
        }
    )


def _encode_file(plan: Plan, encoder: RowEncoder, path: str, key: str) -> list[Encoded]:
    """The encoded rows of one file that have a trained token."""
    encoded = [encoder.encode(r) for r in rows_of(path, key, plan.resolved.data.messages_field)]
    seq_len = plan.resolved.data.seq_len
    long = [(i, len(e.input_ids)) for i, e in enumerate(encoded) if len(e.input_ids) > seq_len]
    if long:
        longest = max(n for _, n in long)
        rows = ", ".join(str(i) for i, _ in long[:SHOWN_ROWS]) + (", ..." if len(long) > SHOWN_ROWS else "")
        raise ApplyError(
            f"data.seq_len = {seq_len}: {len(long)} rows of {path} have more tokens, their image tokens included "
            f"(rows {rows}; the longest has {longest})",
            key="data.seq_len",
            fix=f"set data.seq_len = {longest}: rows with images are not cut, a cut through an image's tokens breaks the row",
        )
    return [e for e in encoded if any(e.trained)]


class ImageTextCollator:
    """Encoded rows -> the processor's batch (input_ids, attention_mask, pixel_values, ...) with labels.

    Every row is padded to data.seq_len, so tokens per step = sequences x seq_len as planned."""

    def __init__(self, processor: Any, seq_len: int, image_ids: list[int]):
        self.processor = processor
        self.seq_len = seq_len
        self.image_ids = image_ids

    def add_config(self, model_config: Any) -> None:
        """The model config's image token ids too (image_token_id, vision_start_token_id, ...)."""
        self.image_ids = sorted(set(self.image_ids) | set(image_token_ids(self.processor, model_config)))

    def image_tokens_of(self, ds: Any, rows: int) -> list[int]:
        """Tokens per image (the image ids, markers included) in each of the first `rows` rows, as this collator builds them."""
        import torch

        out = []
        for i in range(min(rows, len(ds))):
            row = ds[i]
            if row["images"]:
                ids = self([row])["input_ids"][0]
                out.append(int(torch.isin(ids, torch.tensor(self.image_ids, dtype=ids.dtype)).sum()) // len(row["images"]))
        return out or [0]

    def image_tokens_for_size(self, size: Any) -> int:
        """Tokens one blank image of `size` (px: a side, or (width, height)) becomes through the live processor."""
        import torch
        from PIL import Image

        w, h = (size, size) if isinstance(size, int) else tuple(size)
        text = getattr(self.processor, "image_token", None) or ""
        enc = self.processor(text=[text], images=[[Image.new("RGB", (w, h))]], add_special_tokens=False, return_tensors="pt")
        ids = enc["input_ids"][0]
        return int(torch.isin(ids, torch.tensor(self.image_ids, dtype=ids.dtype)).sum())

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        texts = [f["text"] for f in features]
        images = [open_images(list(f["images"])) for f in features]
        kwargs: dict[str, Any] = dict(padding="max_length", max_length=self.seq_len, add_special_tokens=False, return_tensors="pt")
        if any(images):
            enc = self.processor(text=texts, images=images, **kwargs)
        else:
            enc = self.processor.tokenizer(texts, **kwargs)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        trained = torch.zeros_like(ids, dtype=torch.bool)
        for row, f in enumerate(features):
            want = list(f["input_ids"])
            if ids.shape[1] != self.seq_len or ids[row, : len(want)].tolist() != want or int(mask[row].sum()) != len(want):
                raise ApplyError(
                    "gpuplan bug: the processor's ids for a whole row differ from its segments' "
                    f"({len(want)} ids by segment, {int(mask[row].sum())} for the row)",
                    fix="train with data.train_on_prompt = true (no segments to align), and report the tokenizer as a gpuplan bug",
                )
            trained[row, : len(want)] = torch.tensor(list(f["trained"]), dtype=torch.bool)
        keep = trained & mask.bool() & ~torch.isin(ids, torch.tensor(self.image_ids, dtype=ids.dtype))
        batch = dict(enc)
        batch["labels"] = torch.where(keep, ids, torch.full_like(ids, IGNORE_INDEX))
        return batch


def prepare_vision(plan: Plan, processor: Any, model_config: Any = None) -> Any:
    """PreparedData for a vision-language chat run (prepare.py's contract)."""
    from gpuplan.apply.data.prepare import PreparedData, train_paths

    check_before_run(plan)
    train = encode_split(plan, processor, train_paths(plan), data_key(plan))
    ev = None
    if plan.resolved.data.eval_files:
        ev = encode_split(plan, processor, list(plan.resolved.data.eval_files), "data.eval_files")
    elif plan.resolved.data.eval_fraction > 0:
        parts = train.train_test_split(test_size=plan.resolved.data.eval_fraction, seed=plan.resolved.training.seed)
        train, ev = parts["train"], parts["test"]
    collator = ImageTextCollator(processor, plan.resolved.data.seq_len, image_token_ids(processor, model_config))
    return PreparedData(train, ev, collator, None)


def preview_vision(plan: Plan, n_examples: int) -> dict[str, Any]:
    """`gpuplan data` for image rows (preview.py's dict): each example's trained and masked text with a run
    of image tokens shown once with its count, and the statistics of the train file."""
    import re

    from gpuplan.apply.data.examples import segments_of
    from gpuplan.apply.data.prepare import train_paths
    from gpuplan.hub.fetch import model_dir

    check_before_run(plan)
    processor = load_processor(model_dir(plan.resolved.model.hub), plan.resolved.model.trust_remote_code)
    paths, key = train_paths(plan), data_key(plan)
    rows = sum(len(read_rows(p, key, plan.resolved.data.messages_field)) for p in paths)
    ds = encode_split(plan, processor, paths, key)
    token: str = getattr(processor, "image_token", None) or ""

    def shown(text: str) -> str:
        if not token:
            return text
        return re.sub(f"(?:{re.escape(token)}){{2,}}", lambda m: f"{token} x {len(m.group(0)) // len(token)}", text)

    seq_len = plan.resolved.data.seq_len
    examples = []
    for r in ds.select(range(min(n_examples, len(ds)))):
        segments = [{**s, "text": shown(s["text"])} for s in segments_of(r["input_ids"], r["trained"], processor.tokenizer)]
        examples.append({"tokens": len(r["input_ids"]), "truncated": False, "images": len(r["images"]), "segments": segments})
    tokens = sum(len(x) for x in ds["input_ids"])
    stats = {
        "rows": rows,
        "examples": len(ds),
        "dropped_rows": rows - len(ds),
        "truncated_rows": 0,  # rows with images are refused over seq_len, never cut (encode_split)
        "tokens": tokens,
        "trained_tokens": sum(sum(t) for t in ds["trained"]),
        "sequences": len(ds),
        "seq_len": seq_len,
        "packing": False,
        "packing_efficiency": tokens / (len(ds) * seq_len) if len(ds) else None,
        "images": sum(len(x) for x in ds["images"]),
    }
    return {"examples": examples, "stats": stats}
