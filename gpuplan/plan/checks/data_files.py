"""Plan-time checks of what the run will read from disk: the data files exist.

A missing data file used to pass `plan` and `validate` and fail seconds into `apply`,
leaving a failed run state behind; the plan now refuses it. Paths were already
resolved against the spec's directory (inputs/spec_settings.py flatten), so a spec plans the same from
any working directory. This reads the file system and nothing else: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuplan.plan.types import Diagnostic

DATA_KEYS = ("data.train_files", "data.eval_files")


def data_file_problems(files: Mapping[str, list[str]], spec_dir: str) -> list[Diagnostic]:
    """One error per listed data file that is missing, not a file, or empty.

    `files` maps data.train_files / data.eval_files to their paths, already resolved
    against `spec_dir`."""
    out = []
    for key in DATA_KEYS:
        for i, path in enumerate(files.get(key) or []):
            where = f"{key}[{i}]"
            if os.path.isfile(path):
                if os.path.getsize(path) == 0:
                    out.append(
                        Diagnostic(
                            "error", where, f"{where}: {path} is empty", fix=f"put the training text in {path}, or remove it from {key}"
                        )
                    )
                continue
            what = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
            out.append(
                Diagnostic(
                    "error",
                    where,
                    f"{where}: {path} {what}",
                    detail=f"paths in {key} are relative to the spec's directory ({spec_dir})",
                    fix=f"create {path}, or correct {key} (list the files themselves, not a directory)",
                )
            )
    return out
