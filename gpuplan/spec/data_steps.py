"""How many optimizer steps the training data gives, counted at plan time.

A run set by `training.num_train_epochs` trains as many optimizer steps as its data makes,
and one set by `max_steps` repeats the data when it runs out; either way a step cannot hold
more examples than the data has. transformers 5.24 Trainer.set_initial_training_values
takes `max(len_dataloader // gradient_accumulation_steps + int(len_dataloader %
gradient_accumulation_steps > 0), 1)` optimizer steps per epoch, so 135 sequences under an
effective batch of 256 give one partial step per epoch: three "steps" over the whole run,
each of 135 sequences, never the batch the plan priced. The plan counts the sequences,
says how many optimizer steps they give, and refuses an effective batch the data cannot fill.

Counting follows apply/data/prepare.py: datasets' text builder gives one row per line and blank
documents are dropped; an eval_fraction split keeps `floor((1 - fraction) * rows)` rows for
training (datasets Dataset.train_test_split: n_test = ceil(test_size * n)); unpacked, every
kept row is one seq_len sequence; packed text is each document's tokens, plus the BOS / EOS
the run adds, cut into seq_len blocks per 1,000 documents (apply/data/prepare.py `group`, batch_size
1000, the short tail of each batch dropped). Tokens are counted exactly for a model trained
from scratch (apply/data/tokenizer.py: one id per UTF-8 byte) and with the model directory's own
tokenizer.json (the `tokenizers` library, no torch) when there is one; otherwise they are
estimated at 4 bytes per token (OpenAI, "What are tokens and how to count them?": about 4
characters of English text per token), and an estimate only warns. Packed chat and
instruction examples are laid whole into blocks (apply/data/examples.py), so their count is a
lower bound, ceil(tokens / seq_len). Local .txt / .jsonl / .json / .csv files up to
COUNT_LIMIT bytes are counted; parquet files and Hub datasets are counted by apply.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpuplan.errors import Diagnostic, GpuplanError, Severity
from gpuplan.spec.data_format import read_rows

COUNT_LIMIT = 64 * 2**20  # bytes of training files the plan reads whole
BYTES_PER_TOKEN = 4  # the estimate without a tokenizer (module docstring)
PACK_BATCH = 1000  # documents per `group` call in apply/data/prepare.py
MIN_STEPS_PER_EPOCH = 8  # what a suggested effective batch leaves an epoch
_COUNTED = (".txt", ".text", ".jsonl", ".json", ".csv")
PROBE = "a"  # apply/data/specials.py: one text encoded with and without the post-processor's ids
ESTIMATED = f"estimated at {BYTES_PER_TOKEN} bytes per token, no local tokenizer.json"


@dataclass(frozen=True)
class DataSize:
    """The training sequences one epoch holds, and how they were counted."""

    rows: int  # training rows kept (blank ones dropped, the eval split taken out)
    sequences: int  # seq_len-long sequences an epoch holds
    exact: bool  # False: tokens estimated, or packed examples counted as a lower bound
    basis: str  # how, in words


def _row_text(row: Mapping[str, Any], fields: tuple[str, ...]) -> str:
    """The text of the fields a row trains on (lists of chat messages: their contents)."""
    parts: list[str] = []
    for f in fields:
        v = row.get(f)
        if isinstance(v, str):
            parts.append(v)
        elif isinstance(v, list):
            parts.extend(str(m.get("content", "")) for m in v if isinstance(m, Mapping))
    return "\n".join(parts)


def _fields(values: Mapping[str, Any]) -> tuple[str, ...]:
    fmt = values.get("data.format") or "text"
    if fmt == "chat":
        return (values["data.messages_field"],)
    if fmt == "instruction":
        return (values["data.prompt_field"], values["data.response_field"])
    return (values["data.text_field"],)


class TokenCounter(NamedTuple):
    tokens: Callable[[list[str]], list[int]]  # texts -> their tokens, without the post-processor's ids
    around: int  # the ids apply/data/prepare.py puts around each packed document
    how: str  # in words
    specials: int  # the ids the post-processor adds to an encoded text (BOS ...), as TRL's `_tokenize` gets them
    eos: int  # 1 when the tokenizer names an eos_token (TRL appends it to a plain-text answer), else 0


def estimated_tokens(text: str) -> int:
    """A text's tokens without a tokenizer: BYTES_PER_TOKEN bytes per token (module docstring)."""
    return max(1, len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def token_counter(source: str | None, from_scratch: bool) -> TokenCounter | None:
    """How texts are counted, as apply/data/tokenizer.py load_tokenizer picks the tokenizer: the model
    directory's own, else, from scratch, the byte-level one; None when only an estimate is possible."""
    files = os.listdir(source) if source and os.path.isdir(source) else []
    if "tokenizer.json" in files:
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(os.path.join(str(source), "tokenizer.json"))
            full, bare = tok.encode(PROBE).ids, tok.encode(PROBE, add_special_tokens=False).ids
        except Exception:  # noqa: BLE001 - an unreadable tokenizer leaves the estimate
            return None
        # apply/data/specials.py: the post-processor's ids before and after the document; none after: one EOS
        at = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None)
        lead, suffix = (0, 0) if at is None else (at, len(full) - at - len(bare))
        around = lead + (suffix if suffix else int(_has_eos(str(source))))

        def count(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

        return TokenCounter(count, around, "counted with the model's tokenizer.json", lead + suffix, int(_has_eos(str(source))))
    if from_scratch and not any(f.startswith("tokenizer") or f in ("vocab.json", "vocab.txt") for f in files):
        # its post-processor adds nothing (apply/data/specials.py affixes: ([], [])), so one EOS ends a document
        how = "counted with the byte-level tokenizer, one per byte"
        return TokenCounter(lambda texts: [len(t.encode("utf-8")) for t in texts], 1, how, 0, 1)  # its <eos> (apply/data/tokenizer.py)
    return None


def _has_eos(model_dir: str) -> bool:
    """Whether the directory's tokenizer names an eos_token (tokenizer_config.json / special_tokens_map.json)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            with open(os.path.join(model_dir, name), encoding="utf-8") as f:
                if json.load(f).get("eos_token"):
                    return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


_READ_KEYS = (
    "data.train_files",
    "data.dataset",
    "training.objective",
    "data.format",
    "data.text_field",
    "data.messages_field",
    "data.prompt_field",
    "data.response_field",
    "data.eval_files",
    "data.eval_fraction",
    "data.seq_len",
    "data.packing",
)
_counted: dict[tuple, DataSize | None] = {}  # one count per set of files as they are on disk: compare plans each GPU


def _stat(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return str(path), st.st_mtime_ns, st.st_size


def data_size(values: Mapping[str, Any], spec_dir: str, *, source: str | None, from_scratch: bool) -> DataSize | None:
    """The sequences an epoch holds, or None when the plan cannot count them (Hub data,
    parquet, files over COUNT_LIMIT, preference objectives, unreadable rows). Counted once for
    the same files (path, mtime, size), settings and tokenizer: `compare` plans a spec on every GPU."""
    read = tuple((k, repr(values.get(k))) for k in _READ_KEYS)
    files = tuple(_stat(Path(spec_dir, f)) for f in values.get("data.train_files") or [])
    tokenizer = _stat(Path(source, "tokenizer.json")) if source else None
    key = (read, spec_dir, files, source, tokenizer, from_scratch)
    if key not in _counted:
        if len(_counted) > 64:
            _counted.clear()
        _counted[key] = _data_size(values, spec_dir, source=source, from_scratch=from_scratch)
    return _counted[key]


def _data_size(values: Mapping[str, Any], spec_dir: str, *, source: str | None, from_scratch: bool) -> DataSize | None:
    files = values.get("data.train_files") or []
    if values.get("data.dataset") or not files or (values.get("training.objective") or "sft") != "sft":
        return None
    paths = [Path(spec_dir, f) for f in files]
    if any(p.suffix.lower() not in _COUNTED or not p.is_file() for p in paths):
        return None
    if sum(p.stat().st_size for p in paths) > COUNT_LIMIT:
        return None
    fmt = values.get("data.format") or "text"
    fields = ("text",) if fmt == "text" and all(p.suffix.lower() in (".txt", ".text") for p in paths) else _fields(values)
    try:
        rows = [r for p in paths for r in read_rows(p, str(p), n=2**62)]
    except GpuplanError:
        return None  # data_field_problems and apply name an unreadable file
    texts = [_row_text(r, fields) if isinstance(r, Mapping) else "" for r in rows]
    fraction = 0.0 if values.get("data.eval_files") else float(values.get("data.eval_fraction") or 0.0)
    if 0.0 < fraction <= 0.5:
        kept = math.floor((1 - fraction) * len(texts))
        share = kept / len(texts) if texts else 0.0
    else:
        kept, share = len(texts), 1.0
    documents = [t for t in texts if t.strip()]
    train_rows = round(len(documents) * share)
    seq_len = int(values["data.seq_len"])
    split = f"; {kept} of {len(texts)} rows after the eval split" if share < 1.0 else ""
    if not values.get("data.packing"):
        return DataSize(train_rows, train_rows, True, f"{train_rows} rows, one {seq_len}-token sequence each{split}")
    counter = token_counter(source, from_scratch)
    if counter is None:
        lengths = [estimated_tokens(t) for t in documents]
        around, how, exact = 2, ESTIMATED, False
    else:
        lengths, around, how = counter.tokens(documents), counter.around, counter.how
        exact = True
    framed = [n + around for n in lengths]  # with the ids apply/data/prepare.py puts around each document
    if fmt == "text":
        sequences = sum(sum(framed[i : i + PACK_BATCH]) // seq_len for i in range(0, len(framed), PACK_BATCH))
    else:  # whole examples laid into blocks: at least this many
        sequences, exact = math.ceil(sum(framed) / seq_len), False
    sequences = round(sequences * share)  # the eval split takes whole rows: within a block or two
    tokens = round(sum(framed) * share)
    return DataSize(train_rows, sequences, exact, f"{tokens:,} tokens, {how}, packed into {seq_len}-token blocks{split}")


def optimizer_steps_per_epoch(sequences: int, per_device: int, accumulation: int, world: int) -> int:
    """transformers 5.24 Trainer: len(dataloader) per rank (DistributedSampler pads to whole
    ranks, drop_last False), then the steps per epoch quoted in the module docstring."""
    batches = math.ceil(math.ceil(sequences / world) / per_device)
    return max(batches // accumulation + int(batches % accumulation > 0), 1)


def suggested_batch(sequences: int, world: int) -> int:
    """The largest power of two (a multiple of `world`) that leaves an epoch MIN_STEPS_PER_EPOCH full steps."""
    target = max(world, sequences // MIN_STEPS_PER_EPOCH)
    b = 2 ** (target.bit_length() - 1)
    return max(world, b - b % world)


def data_steps_diagnostics(
    size: DataSize, *, per_device: int, accumulation: int, world: int, epochs: float, max_steps: int | None
) -> list[Diagnostic]:
    """A note with the optimizer steps the data gives; an error (a warning, when the count is an
    estimate) when one optimizer step would need more sequences than an epoch holds."""
    effective = per_device * accumulation * world
    per_epoch = optimizer_steps_per_epoch(size.sequences, per_device, accumulation, world)
    if size.sequences < effective:
        fix_batch = suggested_batch(size.sequences, world)
        summary = (
            f"the data holds {'' if size.exact else 'about '}{size.sequences:,} training sequences, fewer than one optimizer step's "
            f"effective batch of {effective}: every step would see those {size.sequences:,} only, never the batch this plan prices"
        )
        fix = (
            f"set training.effective_batch_size = {fix_batch} ({math.ceil(size.sequences / fix_batch)} optimizer steps per epoch), "
            "or add training data"
        )
        values: dict[str, int] | None = {"training.effective_batch_size": fix_batch}
        if size.sequences < world:
            fix = f"add training data: {size.sequences} sequences cannot give each of the {world} processes one"
            values = None
        severity: Severity = "error" if size.exact else "warning"
        return [Diagnostic(severity, "training.effective_batch_size", summary, detail=size.basis, fix=fix, fix_values=values)]
    total = max_steps if max_steps is not None else math.ceil(epochs * per_epoch)
    how = (
        f"max_steps = {max_steps}: {max_steps / per_epoch:.3g} passes over the data"
        if max_steps is not None
        else f"{total:,} over {epochs:g} epoch(s)"
    )
    about = "" if size.exact else "about "
    return [
        Diagnostic(
            "note",
            "training.num_train_epochs" if max_steps is None else "training.max_steps",
            f"the data gives {about}{per_epoch:,} optimizer steps per epoch "
            f"({size.sequences:,} sequences / effective batch {effective}); {how}",
            detail=size.basis,
        )
    ]
