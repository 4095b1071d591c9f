"""Which files of a Hub dataset make up data.split: the dataset card's configs, else the file names.

A dataset card (README.md, already fetched to plan) may map splits to files in its YAML
header, the way `datasets.load_dataset(repo)` reads it (huggingface.co/docs/hub/
datasets-manual-configuration):

    configs:
    - config_name: default
      data_files:
      - split: train_sft
        path: data/train_sft-*

The default config is the one with `default: true`, else the one named "default", else
the first; a data_files string or list without splits is the "train" split. Without
configs, apply splits the files by name with datasets' own keywords
(datasets.data_files.get_data_patterns: "train", "training", ... delimited by -._ or a
digit), and a snapshot without any split keyword is all "train", as in `datasets`.
The card is parsed with huggingface_hub.repocard.metadata_load (no datasets import, so
planning stays light).
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from typing import Any

from gpuplan.errors import OneProblem

DEFAULT_SPLIT = "train"


class SplitError(OneProblem):
    """data.split names no split of the dataset; the summary lists those it has, the fix names one."""

    def __init__(self, split: str, available: list[str], where: str):
        self.available = available
        close = difflib.get_close_matches(split, available, n=1, cutoff=0.4)
        hint = f'did you mean "{close[0]}"? ' if close else ""
        fix = f'set data.split = "{close[0] if close else available[0]}"' if available else None
        super().__init__(
            f"data.split: {split!r} is no split of {where}, which has {', '.join(available)}; {hint}set data.split to one of them",
            key="data.split",
            fix=fix,
        )


def card_configs(readme: str) -> list[dict[str, Any]]:
    """The `configs` list of a dataset card's YAML header ([] without one)."""
    from huggingface_hub.repocard import metadata_load

    try:
        meta = metadata_load(readme) or {}
    except Exception:  # a card whose YAML does not parse is a card without configs, as datasets treats it
        return []
    configs = meta.get("configs")
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _default_config(configs: list[dict[str, Any]]) -> dict[str, Any]:
    for c in configs:
        if c.get("default") is True:
            return c
    return next((c for c in configs if c.get("config_name") == "default"), configs[0])


def split_map(configs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{split: [path patterns]} of the default config."""
    files = _default_config(configs).get("data_files")
    if isinstance(files, (str, list)) and not (isinstance(files, list) and files and isinstance(files[0], dict)):
        return {DEFAULT_SPLIT: [files] if isinstance(files, str) else [str(f) for f in files]}
    out: dict[str, list[str]] = {}
    for entry in files or []:
        if isinstance(entry, dict) and isinstance(entry.get("split"), str):
            path = entry.get("path")
            out.setdefault(entry["split"], []).extend([path] if isinstance(path, str) else [str(p) for p in path or []])
    return out


def card_patterns(readme: str, split: str) -> list[str] | None:
    """The card's file patterns for `split`; None when the card maps no splits. Raises SplitError."""
    configs = card_configs(readme)
    if not configs:
        return None
    splits = split_map(configs)
    if not splits:
        return None
    if split not in splits:
        raise SplitError(split, list(splits), "the dataset card's default config")
    return splits[split]


def fetch_patterns(patterns: list[str]) -> list[str]:
    """huggingface_hub allow_patterns for datasets-style patterns ("**/" may match no folder)."""
    out = []
    for p in patterns:
        out.append(p)
        if p.startswith("**/"):
            out.append(p[3:])
    return out


def matching(folder: str, files: list[str], patterns: list[str]) -> list[str]:
    rel = {f: os.path.relpath(f, folder).replace(os.sep, "/") for f in files}
    return [f for f in files if any(fnmatch.fnmatch(rel[f], p) for p in fetch_patterns(patterns))]


def by_file_names(folder: str, files: list[str], split: str) -> list[str]:
    """The files of `split` by datasets' split keywords in their names (apply only: imports datasets)."""
    from datasets.data_files import get_data_patterns

    try:
        patterns = {str(k): v for k, v in get_data_patterns(folder).items()}
    except Exception:  # datasets raises EmptyDatasetError when it finds nothing it can load
        patterns = {}
    if split not in patterns:
        raise SplitError(split, sorted(patterns) or [DEFAULT_SPLIT], "its file names")
    return matching(folder, files, patterns[split])
