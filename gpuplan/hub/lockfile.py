"""The lock file: every Hub id of a spec pinned to a commit, with the sha256 of each file the run needs.

Like Terraform's .terraform.lock.hcl it lives next to the spec and is committed with it:
chat.toml -> chat.lock.json. `gpuplan lock SPEC` writes it (keeping pins
that still match the spec), `--upgrade` moves every pin to where its revision points now.
Pure JSON handling here; resolving and hashing are in gpuplan/cli/lock.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuplan.errors import OneProblem

FORMAT_VERSION = 1
SUFFIX = ".lock.json"


class LockFileError(OneProblem):
    """The lock file beside a spec cannot be read or does not match the spec."""


def lock_path(spec_path: str | Path) -> Path:
    p = Path(spec_path)
    return p.with_name(p.stem + SUFFIX)


def read_lock(spec_path: str | Path) -> dict[str, Any] | None:
    """The lock file's repos ({spec key: entry}), or None when there is none."""
    path = lock_path(spec_path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LockFileError(f"{path}: not a readable lock file ({e}); delete it and run `gpuplan lock {spec_path}`") from None
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION or not isinstance(data.get("repos"), dict):
        raise LockFileError(f"{path}: not a gpuplan lock file of format {FORMAT_VERSION}; delete it and run `gpuplan lock {spec_path}`")
    return data["repos"]


def locked_entry(repos: dict[str, Any] | None, key: str, repo_id: str, repo_type: str, revision: str) -> dict[str, Any] | None:
    """The pin for this key when it locks the same repo and revision the spec names, else None."""
    entry = (repos or {}).get(key)
    if not isinstance(entry, dict):
        return None
    same = (entry.get("repo_id"), entry.get("repo_type"), entry.get("revision")) == (repo_id, repo_type, revision)
    return entry if same and isinstance(entry.get("commit"), str) else None


def render_lock(repos: dict[str, Any]) -> str:
    data = {
        "format_version": FORMAT_VERSION,
        "comment": "Written by `gpuplan lock`; commit it with the spec. `gpuplan lock SPEC --upgrade` moves the pins.",
        "repos": {k: repos[k] for k in sorted(repos)},
    }
    return json.dumps(data, indent=2) + "\n"
