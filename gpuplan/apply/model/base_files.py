"""The base model's files as apply read them, so later commands can tell whether they changed.

Recorded in the run's results ("base_files") at the start of apply, compared by
generate / chat / eval / export before they load the base again. A file up to
FULL_HASH_BYTES is hashed whole (config, tokenizer, small weights); a larger one by
its size and the sha256 of its first and last SAMPLE_BYTES (a safetensors file starts
with its header of names, shapes and offsets, and rewritten weights change the first
tensor's bytes), so checking a 16 GB base costs milliseconds, not a minute.
Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

FULL_HASH_BYTES = 64 * 2**20
SAMPLE_BYTES = 2**20
_SKIP_DIRS = {".cache", ".git"}


def file_digest(path: str) -> str:
    size = os.path.getsize(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
            return h.hexdigest()
        h.update(f.read(SAMPLE_BYTES))
        f.seek(size - SAMPLE_BYTES)
        h.update(f.read(SAMPLE_BYTES))
    return "sampled:" + h.hexdigest()


def base_fingerprint(model_dir: str) -> dict[str, dict[str, Any]]:
    """{relative path: {size, sha256}} of every file under model_dir (links followed)."""
    out: dict[str, dict[str, Any]] = {}
    for root, dirs, names in os.walk(model_dir, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path):
                out[os.path.relpath(path, model_dir)] = {"size": os.path.getsize(path), "sha256": file_digest(path)}
    return out


def changed_files(recorded: Mapping[str, Mapping[str, Any]], model_dir: str) -> list[str]:
    """What differs now from `recorded`: "NAME changed", "NAME is gone", "NAME is new"."""
    now = base_fingerprint(model_dir) if os.path.isdir(model_dir) else {}
    out = [f"{n} is gone" for n in sorted(recorded) if n not in now]
    out += [f"{n} changed" for n in sorted(recorded) if n in now and dict(now[n]) != dict(recorded[n])]
    out += [f"{n} is new" for n in sorted(now) if n not in recorded]
    return out


def base_files(plan: Any) -> dict[str, dict[str, Any]] | None:
    """The fingerprint of the pretrained base a plan reads; None when it trains from scratch."""
    if plan.resolved.model.from_scratch or not plan.resolved.model.name_or_path:
        return None
    from gpuplan.hub.fetch import model_dir

    path = model_dir(plan.resolved.model.hub)
    return base_fingerprint(path) if path and os.path.isdir(path) else None
