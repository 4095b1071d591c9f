"""`gpuplan init --data`: a local data file or a Hub dataset id, and the spec's data keys its rows give.

The format is told from the rows by spec/data_format.py; a Hub dataset's files are picked as
apply picks them (hub/splits.py), from the cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.spec.data_format import SUFFIXES, DataFormat, data_error, detect_format, read_rows


def data_source(data: str, *, cwd: Path, spec_dir: Path) -> tuple[dict[str, Any], DataFormat]:
    """`--data`: a local file (written into data.train_files, relative to the spec) or a Hub
    dataset id (data.dataset, resolved as plan resolves it); its rows give the format."""
    from gpuplan.hub.ids import is_hub_id
    from gpuplan.init.model_source import relative

    path = Path(data) if Path(data).is_absolute() else cwd / data
    if path.exists() or data.lower().endswith(SUFFIXES) or not is_hub_id(data, cwd):
        if not path.is_file():
            raise data_error(
                data,
                "no such file" if not path.exists() else "is not a file",
                fix=f"give a data file ({', '.join(SUFFIXES)}) or a Hub dataset id (org/name)",
            )
        fmt = detect_format(read_rows(path, data), data)
        return {"data.train_files": [relative(path, spec_dir)], **fmt.values}, fmt
    file, shown, split = _hub_data_file(data, cwd)
    fmt = detect_format(read_rows(file, shown), data)
    if split is None:
        return {"data.dataset": data, **fmt.values}, fmt
    notes = {
        **fmt.notes,
        "data.split": f'The dataset card of {data} maps no "train" split (it has {", ".join(split[1])}): init trains on {split[0]!r}.',
    }
    fmt = DataFormat(fmt.format, fmt.values, fmt.summary, fmt.objective, notes)
    return {"data.dataset": data, "data.split": split[0], **fmt.values}, fmt


def _train_split(splits: dict[str, list[str]], repo_id: str) -> str:
    """The split init trains on: "train" when the card maps it, else the first "train..." one
    (ultrachat_200k: train_sft); raises when the card maps neither."""
    from gpuplan.hub.splits import DEFAULT_SPLIT

    split = DEFAULT_SPLIT if DEFAULT_SPLIT in splits else next((s for s in splits if s.startswith(DEFAULT_SPLIT)), None)
    if split is None:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "data.split",
                    f"--data {repo_id}: its dataset card maps no training split (it has {', '.join(splits)})",
                    fix="run init without --data, then set data.dataset and data.split by hand",
                )
            ]
        )
    return split


def _hub_data_file(repo_id: str, cwd: Path) -> tuple[Path, str, tuple[str, list[str]] | None]:
    """The first data file of a Hub dataset's training split: resolved as plan resolves data.dataset,
    the split's files picked by the card's configs as apply picks them (hub/splits.py), from the
    cache (downloaded otherwise, as apply would). The third item: (the split, the card's splits)
    when the card maps no "train" split, else None."""
    import os

    from gpuplan.hub.fetch import DATA_PATTERNS, DATA_SUFFIXES, data_files_in
    from gpuplan.hub.resolve import README, HubError, resolve, snapshot
    from gpuplan.hub.splits import DEFAULT_SPLIT, card_configs, fetch_patterns, matching, split_map

    key = "data.dataset"
    try:
        ref = resolve(key, repo_id, "dataset", "main", None)
        readme = os.path.join(ref.path, README)
        configs = card_configs(readme) if os.path.isfile(readme) else []
        splits = split_map(configs) if configs else {}
        split = _train_split(splits, repo_id) if splits else None
        patterns = fetch_patterns(splits[split]) if split is not None else DATA_PATTERNS
        folder = snapshot(key, repo_id, "dataset", ref.commit, patterns + [README])
    except HubError as e:  # the Diagnostic plan/inputs/sources.py makes for the same failure
        raise GpuplanError(
            [
                Diagnostic(
                    "error", key, e.message, detail=f"--data {repo_id} is read as a Hub id: no local path {cwd / repo_id} exists", fix=e.fix
                )
            ]
        ) from None
    files = data_files_in(folder)
    if split is not None:
        files = matching(folder, files, splits[split])
    if not files:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    key,
                    f"--data {repo_id}: the dataset at {ref.commit[:12]} holds no data files ({', '.join(DATA_SUFFIXES)}) in {folder}",
                )
            ]
        )
    chosen = (split, list(splits)) if split is not None and split != DEFAULT_SPLIT else None
    return Path(files[0]), f"{repo_id} ({os.path.relpath(files[0], folder)})", chosen
