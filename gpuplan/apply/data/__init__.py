"""The training data as the model sees it: loading, chat and instruction rows to labelled
sequences, packing, tokenizers, and `gpuplan data`'s preview of it."""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "PreparedData": "gpuplan.apply.data.prepare",
    "prepare_data": "gpuplan.apply.data.prepare",
    "preview": "gpuplan.apply.data.preview",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
