"""Chat / instruction examples -> fixed-length training sequences with labels, and their statistics.

Each row is tokenized (chat.py), truncated to data.seq_len, and labelled: trained tokens
keep their id, the rest get IGNORE_INDEX. Rows left with nothing to train are dropped.

Packed (data.packing = true, planned only for kernels that honour it): whole examples are
laid greedily, in order, into seq_len blocks; position ids restart at 0 for every example
and no attention_mask is passed, so transformers' masking_utils.find_packed_sequence_indices
turns the position resets into a block-diagonal causal mask (no attention across
examples), the scheme of transformers' DataCollatorWithFlattening, including its -100 on
each example's first label. The block's unused tail is padding with its own positions and
no labels. Under flash_attention_2 the collator lays a micro-batch's blocks in one row
(flatten.py): its varlen path reads the position ids only in a one-row batch.
Unpacked: each example is padded to seq_len with an attention_mask.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpuplan.apply.data.chat import IGNORE_INDEX, Formatter, tokenize_segments


@dataclass(frozen=True)
class DataStats:
    rows: int  # rows read
    examples: int  # rows kept (something left to train after truncation)
    dropped_rows: int  # rows with no trained token within seq_len
    truncated_rows: int  # rows longer than seq_len, cut
    tokens: int  # real tokens of the kept examples, after truncation
    trained_tokens: int  # tokens with a label
    sequences: int  # seq_len-long training sequences
    seq_len: int
    packing: bool

    @property
    def packing_efficiency(self) -> float | None:
        """Real tokens / token slots: 1.0 means no padding."""
        return self.tokens / (self.sequences * self.seq_len) if self.sequences else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "packing_efficiency": self.packing_efficiency}


def tokenize_rows(ds: Any, fmt: Formatter, tokenizer: Any, seq_len: int) -> Any:
    """Columns input_ids, trained (bool per token) and truncated, one row per input row.

    Instruction and text rows start with the ids the tokenizer's post-processor puts first
    (BOS: specials.py), never trained; a chat template writes its own BOS.
    """
    from gpuplan.apply.data.specials import affixes

    lead = [] if fmt.fmt == "chat" else affixes(tokenizer)[0]

    def tokenize(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out: dict[str, list] = {"input_ids": [], "trained": [], "truncated": []}
        for n, i in enumerate(indices):
            row = {k: v[n] for k, v in batch.items()}
            ids, trained = tokenize_segments(fmt.segments(row, i), tokenizer)
            if ids and lead:
                ids, trained = lead + ids, [False] * len(lead) + trained
            out["input_ids"].append(ids[:seq_len])
            out["trained"].append(trained[:seq_len])
            out["truncated"].append(len(ids) > seq_len)
        return out

    return ds.map(tokenize, batched=True, with_indices=True, remove_columns=ds.column_names, desc="tokenize")


def _labels(ids: list[int], trained: list[bool]) -> list[int]:
    return [t if on else IGNORE_INDEX for t, on in zip(ids, trained)]


def to_sequences(tok: Any, seq_len: int, pad_id: int, packing: bool) -> Any:
    """Fixed-length sequences from the tokenized rows (see the module docstring)."""

    def padded(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {"input_ids": [], "labels": [], "attention_mask": []}
        for ids, trained in zip(batch["input_ids"], batch["trained"]):
            pad = seq_len - len(ids)
            out["input_ids"].append(ids + [pad_id] * pad)
            out["labels"].append(_labels(ids, trained) + [IGNORE_INDEX] * pad)
            out["attention_mask"].append([1] * len(ids) + [0] * pad)
        return out

    def packed(batch: dict[str, list]) -> dict[str, list]:
        out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
        ids_b: list[int] = []
        lab_b: list[int] = []
        pos_b: list[int] = []

        def close() -> None:
            pad = seq_len - len(ids_b)
            out["input_ids"].append(ids_b + [pad_id] * pad)
            out["labels"].append(lab_b + [IGNORE_INDEX] * pad)
            out["position_ids"].append(pos_b + list(range(pad)))

        for ids, trained in zip(batch["input_ids"], batch["trained"]):
            if ids_b and len(ids_b) + len(ids) > seq_len:
                close()
                ids_b, lab_b, pos_b = [], [], []
            ids_b += ids
            lab_b += [IGNORE_INDEX] + _labels(ids, trained)[1:]
            pos_b += list(range(len(ids)))
        if ids_b:
            close()
        return out

    return tok.map(
        packed if packing else padded, batched=True, batch_size=1000, remove_columns=tok.column_names, desc="pack" if packing else "pad"
    )


def build(ds: Any, fmt: Formatter, tokenizer: Any, seq_len: int, packing: bool) -> tuple[Any, Any, DataStats]:
    """(tokenized rows, training sequences, statistics) for one split."""
    tok = tokenize_rows(ds, fmt, tokenizer, seq_len)
    truncated = sum(tok["truncated"])
    kept = tok.filter(lambda r: any(r["trained"]), desc="drop rows with nothing to train")
    lengths = [len(x) for x in kept["input_ids"]]
    trained = sum(sum(t) for t in kept["trained"])
    seqs = to_sequences(kept, seq_len, tokenizer.pad_token_id, packing)
    stats = DataStats(
        rows=len(ds),
        examples=len(kept),
        dropped_rows=len(ds) - len(kept),
        truncated_rows=truncated,
        tokens=sum(lengths),
        trained_tokens=trained,
        sequences=len(seqs),
        seq_len=seq_len,
        packing=packing,
    )
    return kept, seqs, stats


def segments_of(ids: list[int], trained: list[bool], tokenizer: Any) -> list[dict[str, Any]]:
    """Runs of trained / masked tokens, each decoded to text."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or trained[i] != trained[start]:
            out.append({"text": tokenizer.decode(ids[start:i]), "trained": bool(trained[start])})
            start = i
    return out
