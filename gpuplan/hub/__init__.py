"""Hugging Face Hub ids for models and datasets: recognise, resolve to a commit, fetch, lock.

ids.py is pure (no huggingface_hub import); resolve.py imports huggingface_hub lazily,
only when a spec names a Hub id, and never torch.
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

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

__getattr__ = lazy_exports(__name__, _EXPORTS)
