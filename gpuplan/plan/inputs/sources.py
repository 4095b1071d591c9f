"""Hub ids in a spec: resolve each to a commit before the rules run, and record it in the plan.

model.name_or_path and data.dataset may be Hub ids (gpuplan/hub/ids.py tells them from
paths). Each resolves to the commit of its lock file entry when the lock pins the same
repo and revision, else to where its revision points now (cache or Hub). The plan gets
the commit as model.commit / data.commit (derived settings: they are in the saved plan
and the run state, and a changed commit is resume-breaking drift), and a warning when
the revision has moved since the lock. huggingface_hub is imported only for Hub ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuplan.plan.types import Change, Diagnostic, PlanError, Setting

SOURCES = (  # spec key, revision key, commit key, repo type
    ("model.name_or_path", "model.revision", "model.commit", "model"),
    ("data.dataset", "data.revision", "data.commit", "dataset"),
)
RULE = "hub.commit"


def hub_keys(settings: dict[str, Setting]) -> list[tuple[str, str, str, str]]:
    from gpuplan.hub.fetch import is_hub_value

    return [s for s in SOURCES if is_hub_value(settings[s[0]].value)]


def resolve_sources(settings: dict[str, Setting], spec_path: Path) -> dict[str, Any]:
    """{spec key: HubRef} for the spec's Hub ids ({} when it has none)."""
    if settings["data.dataset"].value is not None and settings["data.train_files"].value:
        raise PlanError([Diagnostic("error", "data.dataset", "data.dataset and data.train_files are both set", fix="keep one of them")])
    keys = hub_keys(settings)
    if not keys:
        return {}
    from gpuplan.hub.lockfile import LockFileError, locked_entry, read_lock
    from gpuplan.hub.resolve import HubError, resolve

    try:
        lock = read_lock(spec_path)
    except LockFileError as e:
        raise PlanError([Diagnostic("error", None, str(e), fix=f"gpuplan lock {spec_path}")]) from None
    refs, diags = {}, []
    for key, rev_key, _, kind in keys:
        repo_id, revision = settings[key].value, settings[rev_key].value
        entry = locked_entry(lock, key, repo_id, kind, revision)
        try:
            refs[key] = resolve(key, repo_id, kind, revision, entry["commit"] if entry else None)
        except HubError as e:
            local = spec_path.parent / repo_id
            diags.append(Diagnostic("error", key, e.message, detail=f"{key} is read as a Hub id: no local path {local} exists", fix=e.fix))
    if "data.dataset" in refs and not diags:
        diags += _split_diagnostics(refs["data.dataset"], settings["data.split"].value)
    if diags:
        raise PlanError(diags)
    return refs


def _split_diagnostics(ref: Any, split: str) -> list[Diagnostic]:
    """data.split checked against the dataset card's configs (gpuplan/hub/splits.py), when it maps splits."""
    import os

    from gpuplan.hub.resolve import README
    from gpuplan.hub.splits import SplitError, card_patterns

    readme = os.path.join(ref.path, README)
    try:
        if os.path.isfile(readme):
            card_patterns(readme, split)
    except SplitError as e:
        return [e.diagnostic(detail=f"{ref.repo_id} at {ref.commit[:12]}")]
    return []


def source_settings(refs: dict[str, Any], spec_path: Path) -> tuple[dict[str, Setting], list[Change], list[Diagnostic]]:
    """The commit settings, their changes and the lock diagnostics for the resolved Hub ids."""
    from gpuplan.hub.lockfile import lock_path

    lock_name = lock_path(spec_path).name
    settings: dict[str, Setting] = {}
    changes: list[Change] = []
    diags: list[Diagnostic] = []
    for key, _rev_key, commit_key, _ in SOURCES:
        ref = refs.get(key)
        if ref is None:
            continue
        if ref.locked:
            reason = f"{ref.repo_id} @ {ref.revision}: pinned in {lock_name}"
            if ref.current and ref.current != ref.commit:
                diags.append(
                    Diagnostic(
                        "warning",
                        commit_key,
                        f"{ref.repo_id} {ref.revision} has moved to {ref.current[:12]} since it was locked at "
                        f"{ref.commit[:12]}; the plan uses the locked commit",
                        fix=f"gpuplan lock {spec_path} --upgrade",
                    )
                )
        else:
            reason = f"{ref.repo_id} @ {ref.revision}: where the revision points now (not locked)"
            diags.append(Diagnostic("note", commit_key, f"{ref.repo_id} is not pinned in {lock_name}", fix=f"gpuplan lock {spec_path}"))
        settings[commit_key] = Setting(ref.commit, "derived", reason, RULE)
        changes.append(Change("add", commit_key, None, ref.commit, RULE, reason))
    return settings, changes, diags


def cached_split_files(ref: Any, split: str) -> list[str] | None:
    """The files of data.dataset's split (gpuplan/hub/fetch.py dataset_files) that are already in the cache: the
    plan reads their rows without downloading any (apply fetches them); None when none is cached."""
    from gpuplan.hub.fetch import DatasetRef, dataset_files
    from gpuplan.hub.resolve import HubError
    from gpuplan.hub.splits import SplitError

    try:
        return dataset_files(DatasetRef(ref.repo_id, ref.commit, split))  # local files only
    except (HubError, SplitError, ImportError):  # not cached; a SplitError is the plan's own error already
        return None
