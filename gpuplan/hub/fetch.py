"""apply's side of Hub ids: download what the run needs at the planned commit, then find it locally.

A plan keeps Hub ids as written (local paths are absolute), with the commit in
model.commit / data.commit. `fetch_all` runs once at the start of apply (with progress
bars, into the standard cache); afterwards everything is read with local_files_only.
Weights: safetensors only, unless model.allow_pickle_weights.
"""

from __future__ import annotations

import os

from gpuplan.plan.types import Plan

from .resolve import HubError, snapshot

MODEL_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]
PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.ckpt"]
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")
DATA_PATTERNS = [f"*{s}" for s in DATA_SUFFIXES]


def is_hub_value(value: str | None) -> bool:
    """Plans make every local path absolute; a relative value is a Hub id."""
    return value is not None and not os.path.isabs(value)


def model_patterns(plan: Plan) -> list[str]:
    return MODEL_PATTERNS + (PICKLE_PATTERNS if plan.get("model.allow_pickle_weights") else [])


def _commit(plan: Plan, key: str) -> str:
    commit = plan.get(key)
    if not commit:
        raise HubError(key, "the plan names a Hub id without its resolved commit (made by an older gpuplan?); "
                            "plan again")
    return commit


def model_dir(plan: Plan, *, local_only: bool = True) -> str | None:
    """model.name_or_path as a local directory (the Hub snapshot at model.commit for a Hub id)."""
    value = plan.get("model.name_or_path")
    if not is_hub_value(value):
        return value
    return snapshot("model.name_or_path", value, "model", _commit(plan, "model.commit"), model_patterns(plan),
                    local_only=local_only)


def dataset_dir(plan: Plan, *, local_only: bool = True) -> str:
    return snapshot("data.dataset", plan.value("data.dataset"), "dataset", _commit(plan, "data.commit"),
                    DATA_PATTERNS, local_only=local_only)


def data_files_in(folder: str) -> list[str]:
    """The data files of a dataset snapshot: those naming "train" when some do, else all of them."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(DATA_SUFFIXES)]
    train = [f for f in found if "train" in os.path.relpath(f, folder).lower()]
    return train or found


def dataset_files(plan: Plan) -> list[str]:
    folder = dataset_dir(plan)
    files = data_files_in(folder)
    if not files:
        raise HubError("data.dataset", f"{plan.value('data.dataset')} at {plan.get('data.commit')} holds no data "
                                       f"files ({', '.join(DATA_SUFFIXES)}) in {folder}")
    return files


def fetch_all(plan: Plan) -> None:
    """Download the model and dataset files of the plan's Hub ids (a no-op for local paths)."""
    if is_hub_value(plan.get("model.name_or_path")):
        model_dir(plan, local_only=False)
    if plan.get("data.dataset"):
        dataset_dir(plan, local_only=False)
