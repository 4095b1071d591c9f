"""`gpuplan init`: a starter spec for a model and a GPU that plans cleanly, and what the user
named. Above plan/ in the layer order: it plans its own draft.

starter.py       the commented starter spec for one model config and one GPU
starter_fit.py   the method and memory savers chosen by the planner, so the starter plans cleanly
model_source.py  what `gpuplan init MODEL` names: a config.json, a model directory or a Hub id
data_source.py   what `--data` names: a local data file or a Hub dataset, and the data keys its rows give

    starter_spec(config, gpu, ...) -> str
"""

from __future__ import annotations

from gpuplan.lazy import lazy_exports

_EXPORTS = {"starter_spec": "gpuplan.init.starter"}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
