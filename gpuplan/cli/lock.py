"""`gpuplan lock SPEC [--upgrade]`: pin every Hub id of the spec to a commit and the sha256 of its files.

The lock file (gpuplan/hub/lockfile.py) sits next to the spec. Without --upgrade, pins
that still match the spec's repo and revision are kept and their cached files checked
against the recorded sha256; --upgrade moves every pin to where its revision points
now. Locking fetches the files the run needs (cache first), which apply would fetch anyway.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from typing import Any

from gpuplan.cli.common import UserError, write_atomic


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hashes(folder: str, patterns: list[str]) -> dict[str, str]:
    """{path in the repo: sha256} of the snapshot files matching `patterns` (huggingface_hub's fnmatch rules)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if any(fnmatch.fnmatch(rel, p) for p in patterns):
                out[rel] = _sha256(os.path.join(root, name))
    return out


def _data_patterns(ref: Any, split: str) -> list[str]:
    """The files apply fetches for data.split: the card's (gpuplan/hub/splits.py), else every data file."""
    from gpuplan.hub.fetch import DATA_PATTERNS
    from gpuplan.hub.resolve import README, HubError
    from gpuplan.hub.splits import SplitError, card_patterns, fetch_patterns

    readme = os.path.join(ref.path, README)
    try:
        card = card_patterns(readme, split) if os.path.isfile(readme) else None
    except SplitError as e:
        raise HubError("data.split", str(e), fix=e.fix) from None
    return DATA_PATTERNS if card is None else fetch_patterns(card)


def cmd_lock(args) -> int:
    from gpuplan.hub.fetch import model_fetch_patterns
    from gpuplan.hub.lockfile import (
        LockFileError,
        lock_path,
        locked_entry,
        read_lock,
        render_lock,
    )
    from gpuplan.hub.resolve import README, HubError, resolve, snapshot
    from gpuplan.plan.inputs.sources import hub_keys
    from gpuplan.plan.inputs.spec_settings import flatten
    from gpuplan.spec.load import load_toml
    from gpuplan.spec.validate import validate_spec

    loaded = load_toml(args.spec)
    spec = validate_spec(loaded.raw)
    settings = flatten(spec, loaded.path.parent, loaded.path.stem)
    keys = hub_keys(settings)
    target = lock_path(loaded.path)
    if not keys:
        print(f"{args.spec} names no Hub ids (model.name_or_path, data.dataset are local): nothing to lock")
        return 0
    try:
        old = None if args.upgrade else read_lock(loaded.path)
    except LockFileError as e:
        raise UserError(str(e)) from None
    repos: dict[str, Any] = {}
    lines = []
    for key, rev_key, _, kind in keys:
        repo_id, revision = settings[key].value, settings[rev_key].value
        entry = locked_entry(old, key, repo_id, kind, revision)
        try:
            ref = resolve(key, repo_id, kind, revision, entry["commit"] if entry else None)
            patterns = (
                model_fetch_patterns(repo_id, ref.commit, spec.model.allow_pickle_weights, local_only=False)
                if kind == "model"
                else _data_patterns(ref, spec.data.split) + [README]
            )
            folder = snapshot(key, repo_id, kind, ref.commit, patterns)
        except HubError as e:
            raise UserError(e.message, key=e.key, fix=e.fix) from None
        files = hashes(folder, patterns)
        if entry:
            bad = [f for f, h in (entry.get("files") or {}).items() if f in files and files[f] != h]
            if bad:
                raise UserError(
                    f"{key}: {', '.join(bad)} of {repo_id} at {ref.commit[:12]} in the cache differ from "
                    f"the sha256 in {target}; delete the repo from the cache ({folder}) and lock again"
                )
        repos[key] = {"repo_id": repo_id, "repo_type": kind, "revision": revision, "commit": ref.commit, "files": files}
        if entry:
            moved = (
                f" ({revision} now points at {ref.current[:12]}: --upgrade moves it)" if ref.current and ref.current != ref.commit else ""
            )
            lines.append(f"  {key}: {repo_id} @ {revision} kept at {ref.commit}{moved}")
        else:
            lines.append(f"  {key}: {repo_id} @ {revision} -> {ref.commit} ({len(files)} files)")
    write_atomic(target, render_lock(repos))
    print(f"Wrote {Path(target)}:")
    print("\n".join(lines))
    return 0
