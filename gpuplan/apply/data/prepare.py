"""Training and eval data through the `datasets` library: load, tokenize, pack, label.

Reads plan values data.train_files (or data.dataset, a Hub snapshot: gpuplan/hub/fetch.py),
data.eval_files, data.eval_fraction, data.text_field, data.label_field, data.seq_len,
data.packing, data.format (chat / instruction rows: chat.py and examples.py), model.task
and training.seed. Every example has exactly `seq_len` tokens (packed blocks, or
truncation + padding), so tokens per step = sequences per step x seq_len, the same
count the plan's throughput estimate uses.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.types import Plan

# File suffix -> `datasets` builder. The "text" builder yields one row per line in "text".
BUILDERS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
MLM_PROBABILITY = 0.15  # BERT's masking rate (Devlin et al. 2019, section 3.1)


@dataclass
class PreparedData:
    train: Any  # datasets.Dataset of fixed-length examples
    eval: Any | None
    collator: Any
    label_names: list[str] | None  # seq-cls: id -> name, sorted
    stats: Any = None  # examples.DataStats of the train split (chat / instruction)


def builder_for(paths: list[str], key: str) -> str:
    """The one `datasets` builder for `paths`, after checking each file exists and has bytes."""
    if not paths:
        raise ApplyError(f"{key} is empty; list at least one file (text, jsonl, json, csv or parquet)", key=key)
    kinds = set()
    for p in paths:
        suffix = os.path.splitext(p)[1].lower()
        if suffix not in BUILDERS:
            raise ApplyError(f"{key}: {p} has suffix {suffix!r}; use one of {', '.join(sorted(BUILDERS))}", key=key)
        if not os.path.isfile(p):
            raise ApplyError(f"{key}: {p} does not exist", key=key)
        if os.path.getsize(p) == 0:
            raise ApplyError(f"{key}: {p} is empty", key=key)
        kinds.add(BUILDERS[suffix])
    if len(kinds) > 1:
        raise ApplyError(f"{key} mixes file kinds ({', '.join(sorted(kinds))}); use one kind per list", key=key)
    return kinds.pop()


def cache_dir(plan: Plan) -> str:
    """The `datasets` cache inside output.dir: apply writes nothing outside it (not ~/.cache).

    On a bucket mount (launch.storage_bucket, SkyPilot's MOUNT_CACHED) it is in the node's temp dir
    instead: datasets writes its Arrow file into a `.incomplete` folder, renames the folder and
    memory-maps the file, and rclone's write-back mount cannot serve that file while its upload is
    pending (the mapped read dies with SIGBUS: tests/clusters/test_skypilot_bucket_resume.py runs it
    on a real rclone mount). It is a cache of the data files, rebuilt on a fresh VM."""
    if plan.resolved.launch.on_bucket:
        digest = hashlib.sha256(plan.resolved.output.dir.encode()).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), f"gpuplan-datasets-{digest}")
    return os.path.join(plan.resolved.output.dir, ".cache", "datasets")


def load_rows(paths: list[str], key: str, cache: str | None = None) -> tuple[Any, str]:
    """(datasets.Dataset, builder) for the files of one split; Arrow files and map caches go to `cache`."""
    import datasets

    builder = builder_for(paths, key)
    try:
        ds = datasets.load_dataset(builder, data_files=list(paths), split="train", cache_dir=cache)
    except Exception as e:  # datasets raises many kinds (ArrowInvalid, DatasetGenerationError, ...)
        if "corresponds to no data" in str(e):  # a header without rows, "[]"
            raise ApplyError(f"{key}: {', '.join(paths)} has no rows", key=key) from e
        raise ApplyError(f"{key}: cannot read {', '.join(paths)} as {builder}: {e}", key=key) from e
    if len(ds) == 0:
        raise ApplyError(f"{key}: {', '.join(paths)} has no rows", key=key)
    return ds, builder


def check_field(ds: Any, field: str | None, key: str, paths: list[str], builder: str) -> None:
    if field is None:
        raise ApplyError(f"{key} is not set; seq-cls needs the name of the label column", key=key)
    if field not in ds.column_names:
        hint = ' (text files have the single field "text")' if builder == "text" else ""
        raise ApplyError(
            f"{key} = {field!r}: no such field in {', '.join(paths)}; fields present: "
            f"{', '.join(ds.column_names)}{hint}. Set {key} to one of them"
        )


def text_field_of(plan: Plan, builder: str) -> str:
    # A text file's rows live in "text" whatever the spec calls them.
    return "text" if builder == "text" else plan.resolved.data.text_field


def label_names_of(ds: Any, label_field: str) -> list[str]:
    values = [v for v in ds.unique(label_field) if v is not None]
    if not values:
        raise ApplyError(f"data.label_field = {label_field!r} holds no labels", key="data.label_field")
    if all(isinstance(v, bool) or isinstance(v, int) for v in values):
        return [str(v) for v in sorted(values)]
    return sorted(str(v) for v in values)


def _tokenize_lm(ds: Any, tokenizer: Any, field: str, seq_len: int, packing: bool) -> Any:
    from gpuplan.apply.data.specials import affixes, document_tail

    lead, suffix = affixes(tokenizer)
    tail = document_tail(tokenizer, suffix)

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        texts = [t for t in batch[field] if isinstance(t, str) and t.strip()]
        if packing:  # each document as tokenizer(text) would frame it (BOS first), then its end token
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            return {"input_ids": [lead + x + tail for x in ids]}
        enc = tokenizer(texts, truncation=True, max_length=seq_len, padding="max_length")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    out = ds.map(tokenize, batched=True, remove_columns=ds.column_names, desc="tokenize")
    if not packing:
        return out

    def group(batch: dict[str, list]) -> dict[str, list]:
        # Concatenate then cut into seq_len blocks, dropping the tail shorter than a block:
        # transformers examples/pytorch/language-modeling/run_clm.py `group_texts`.
        flat = [t for ids in batch["input_ids"] for t in ids]
        n = (len(flat) // seq_len) * seq_len
        return {"input_ids": [flat[i : i + seq_len] for i in range(0, n, seq_len)]}

    return out.map(group, batched=True, batch_size=1000, desc=f"pack into {seq_len}-token blocks")


def _tokenize_cls(ds: Any, tokenizer: Any, field: str, label_field: str, names: list[str], seq_len: int) -> Any:
    ids = {n: i for i, n in enumerate(names)}

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        for t in batch[field]:
            if not isinstance(t, str):
                raise ApplyError(f"data.text_field = {field!r}: a row holds {t!r}, not text", key="data.text_field")
        enc = tokenizer(batch[field], truncation=True, max_length=seq_len, padding="max_length")
        labels = []
        for v in batch[label_field]:
            if str(v) not in ids:
                raise ApplyError(f"data.label_field = {label_field!r}: label {v!r} is not among the training labels {names}")
            labels.append(ids[str(v)])
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}

    return ds.map(tokenize, batched=True, remove_columns=ds.column_names, desc="tokenize")


def split_eval(plan: Plan, train: Any) -> tuple[Any, Any | None]:
    files = list(plan.resolved.data.eval_files)
    if files:
        ev, _ = load_rows(files, "data.eval_files", cache_dir(plan))
        return train, ev
    fraction = plan.resolved.data.eval_fraction
    if fraction <= 0.0:
        return train, None
    if not 0.0 < fraction <= 0.5:
        raise ApplyError(f"data.eval_fraction = {fraction} must be in (0, 0.5]", key="data.eval_fraction")
    if len(train) < 2 or round(len(train) * fraction) < 1:
        raise ApplyError(
            f"data.eval_fraction = {fraction} of {len(train)} rows leaves no eval row; "
            "add rows, raise the fraction, or list data.eval_files"
        )
    # Split rows before tokenizing so no document lands in both splits.
    parts = train.train_test_split(test_size=fraction, seed=plan.resolved.training.seed)
    return parts["train"], parts["test"]


def train_paths(plan: Plan) -> list[str]:
    """data.train_files, or the data files of the data.dataset snapshot (fetched through gpuplan.hub)."""
    if plan.resolved.data.dataset:
        from gpuplan.hub.fetch import dataset_files

        return dataset_files(plan.resolved.data.hub)  # a HubError is a GpuplanError: the CLI reports it with its fix
    return list(plan.resolved.data.train_files)


def _prepare_supervised(plan: Plan, tokenizer: Any, raw: Any, builder: str, paths: list[str]) -> PreparedData:
    """chat / instruction rows: labels only on the trained segments (examples.py)."""
    from transformers import default_data_collator

    from gpuplan.apply.data.chat import formatter
    from gpuplan.apply.data.examples import build

    if plan.resolved.model.task != "causal-lm":
        raise ApplyError(f'data.format = {plan.resolved.data.format!r} needs model.task = "causal-lm"')
    fmt = formatter(plan, tokenizer)
    for key, column in fmt.fields:
        check_field(raw, column, key, paths, builder)
    raw_train, raw_eval = split_eval(plan, raw)
    seq_len, packing = plan.resolved.data.seq_len, plan.resolved.data.packing
    _, train, stats = build(raw_train, fmt, tokenizer, seq_len, packing)
    if len(train) == 0:
        raise ApplyError(
            f"data.train_files: no row has a trained token within data.seq_len = {seq_len}; raise data.seq_len or check the data"
        )
    ev = None
    if raw_eval is not None:
        for key, column in fmt.fields:
            check_field(raw_eval, column, key, list(plan.resolved.data.eval_files or paths), builder)
        _, ev, _ = build(raw_eval, fmt, tokenizer, seq_len, packing)
        if len(ev) == 0:
            raise ApplyError("the eval split has no row with a trained token; raise data.eval_fraction")
    from gpuplan.apply.data.flatten import flatten_micro_batch, needs_flattening

    collator = flatten_micro_batch if needs_flattening(plan.resolved.model.attn_implementation, packing) else default_data_collator
    return PreparedData(train, ev, collator, None, stats)


def prepare_data(plan: Plan, tokenizer: Any) -> PreparedData:
    """Load, split, tokenize and collate the plan's data for its task."""
    from transformers import DataCollatorForLanguageModeling, default_data_collator

    task = plan.resolved.model.task
    seq_len = plan.resolved.data.seq_len
    paths = train_paths(plan)
    raw, builder = load_rows(paths, "data.train_files", cache_dir(plan))
    if plan.resolved.data.format != "text":
        return _prepare_supervised(plan, tokenizer, raw, builder, paths)
    field = text_field_of(plan, builder)
    check_field(raw, field, "data.text_field", paths, builder)
    raw_train, raw_eval = split_eval(plan, raw)
    if raw_eval is not None and field not in raw_eval.column_names:
        check_field(raw_eval, field, "data.text_field", list(plan.resolved.data.eval_files), builder)

    label_names = None
    if task == "seq-cls":
        label_field = plan.resolved.data.label_field
        if label_field is None:  # the plan refuses this (rules/data.py); a plan written by hand may not
            raise ApplyError("data.label_field is not set; seq-cls needs the name of the label column", key="data.label_field")
        check_field(raw, label_field, "data.label_field", paths, builder)
        if raw_eval is not None and label_field not in raw_eval.column_names:
            check_field(raw_eval, label_field, "data.label_field", list(plan.resolved.data.eval_files), builder)
        label_names = label_names_of(raw, label_field)
        train = _tokenize_cls(raw_train, tokenizer, field, label_field, label_names, seq_len)
        ev = None if raw_eval is None else _tokenize_cls(raw_eval, tokenizer, field, label_field, label_names, seq_len)
        collator = default_data_collator
    else:
        packing = plan.resolved.data.packing
        train = _tokenize_lm(raw_train, tokenizer, field, seq_len, packing)
        ev = None if raw_eval is None else _tokenize_lm(raw_eval, tokenizer, field, seq_len, packing)
        collator = DataCollatorForLanguageModeling(
            tokenizer, mlm=task == "masked-lm", mlm_probability=MLM_PROBABILITY if task == "masked-lm" else None
        )
    if len(train) == 0:
        raise ApplyError(
            f"data.train_files: {', '.join(paths)} holds fewer than data.seq_len = {seq_len} tokens of text; add text or lower data.seq_len"
        )
    if ev is not None and len(ev) == 0:
        raise ApplyError(f"the eval split holds fewer than data.seq_len = {seq_len} tokens; raise data.eval_fraction")
    return PreparedData(train, ev, collator, label_names)
