"""Hugging Face Hub ids for models and datasets: recognise, resolve to a commit, fetch, lock.

ids.py is pure (no huggingface_hub import); resolve.py imports huggingface_hub lazily,
only when a spec names a Hub id, and never torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "is_hub_id": "gpuplan.hub.ids",
    "HubError": "gpuplan.hub.resolve",
    "HubRef": "gpuplan.hub.resolve",
    "resolve": "gpuplan.hub.resolve",
    "fetch_all": "gpuplan.hub.fetch",
    "read_lock": "gpuplan.hub.lockfile",
    "render_lock": "gpuplan.hub.lockfile",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import on first use: naming the API imports no huggingface_hub."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
