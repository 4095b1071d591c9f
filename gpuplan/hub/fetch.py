"""apply's side of Hub ids: download what the run needs at the planned commit, then find it locally.

A plan keeps Hub ids as written (local paths are absolute), with the commit in
model.commit / data.commit; this module takes them as a ModelRef / DatasetRef (plan.resolved.model.hub,
plan.resolved.data.hub) and knows ids and commits, not plans. `fetch_all` runs once at the start of apply (with progress
bars, into the standard cache); afterwards everything is read with local_files_only.
Weights: safetensors only, unless model.allow_pickle_weights; with an index, only the shards
it names (weights.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuplan.hub.resolve import README, HubError, snapshot
from gpuplan.hub.weights import BASE_PATTERNS, weight_patterns

DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
DATA_PATTERNS = [f"*{s}" for s in DATA_SUFFIXES]


@dataclass(frozen=True)
class ModelRef:
    """model.name_or_path (a Hub id, or an absolute local path) and the commit planning resolved."""

    name_or_path: str | None
    commit: str | None
    allow_pickle_weights: bool = False


@dataclass(frozen=True)
class DatasetRef:
    """data.dataset (a Hub id), its commit and data.split (None: the default split)."""

    dataset: str | None
    commit: str | None
    split: str | None = None


def is_hub_value(value: str | None) -> bool:
    """Plans make every local path absolute; a relative value is a Hub id."""
    return value is not None and not os.path.isabs(value)


def model_fetch_patterns(repo_id: str, commit: str, allow_pickle: bool, *, local_only: bool = True) -> list[str]:
    """The small files, then the weights the index names (every weight file without one): weights.py."""
    base = snapshot("model.name_or_path", repo_id, "model", commit, BASE_PATTERNS, local_only=local_only)
    return BASE_PATTERNS + weight_patterns(base, allow_pickle)


def _commit(commit: str | None, key: str) -> str:
    if not commit:
        raise HubError(key, "the plan names a Hub id without its resolved commit (made by an older gpuplan?); plan again")
    return commit


def _dataset(ref: DatasetRef) -> str:
    dataset = ref.dataset
    if not dataset:
        raise HubError("data.dataset", "the plan reads no Hub dataset (data.dataset is not set)")
    return dataset


def model_dir(m: ModelRef, *, local_only: bool = True) -> str | None:
    """model.name_or_path as a local directory (the Hub snapshot at model.commit for a Hub id)."""
    value = m.name_or_path
    if value is None or not is_hub_value(value):
        return value
    commit = _commit(m.commit, "model.commit")
    patterns = model_fetch_patterns(value, commit, m.allow_pickle_weights, local_only=local_only)
    return snapshot("model.name_or_path", value, "model", commit, patterns, local_only=local_only)


def dataset_split(ref: DatasetRef) -> str:
    from gpuplan.hub.splits import DEFAULT_SPLIT

    return ref.split or DEFAULT_SPLIT


def dataset_card_patterns(ref: DatasetRef, *, local_only: bool = True) -> list[str] | None:
    """The card's file patterns for data.split (splits.py); None when the card maps no splits."""
    from gpuplan.hub.splits import card_patterns

    commit = _commit(ref.commit, "data.commit")
    folder = snapshot("data.dataset", _dataset(ref), "dataset", commit, [README], local_only=local_only)
    readme = os.path.join(folder, README)
    if not os.path.isfile(readme):
        return None
    return card_patterns(readme, dataset_split(ref))  # a SplitError names data.split and the fix


def dataset_dir(ref: DatasetRef, *, local_only: bool = True) -> str:
    """The dataset snapshot with the files of data.split (all data files when the card maps no splits)."""
    from gpuplan.hub.splits import fetch_patterns

    card = dataset_card_patterns(ref, local_only=local_only)
    patterns = fetch_patterns(card) if card is not None else DATA_PATTERNS
    commit = _commit(ref.commit, "data.commit")
    return snapshot("data.dataset", _dataset(ref), "dataset", commit, patterns + [README], local_only=local_only)


def data_files_in(folder: str) -> list[str]:
    """Every data file of a snapshot (by suffix), in path order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(DATA_SUFFIXES)]
    return found


def dataset_files(ref: DatasetRef) -> list[str]:
    """The data files of data.split: by the card's configs, else by datasets' split keywords in file names."""
    from gpuplan.hub.splits import by_file_names, matching

    folder = dataset_dir(ref)
    found = data_files_in(folder)
    card = dataset_card_patterns(ref)
    split = dataset_split(ref)
    files = [] if not found else matching(folder, found, card) if card is not None else by_file_names(folder, found, split)
    if not files:
        raise HubError(
            "data.dataset",
            f"{ref.dataset} at {ref.commit} holds no data files ({', '.join(DATA_SUFFIXES)}) of split {split!r} in {folder}",
        )
    return files


def fetch_all(model: ModelRef, data: DatasetRef) -> None:
    """Download the model and dataset files of a run's Hub ids (a no-op for local paths)."""
    if is_hub_value(model.name_or_path):
        model_dir(model, local_only=False)
    if data.dataset:
        dataset_dir(data, local_only=False)
