"""Model facts without torch: parameter counts and tensor shapes from config.json.

    read_config(path) -> dict
    model_facts(config, task="causal-lm", num_labels=2, *, allow_meta_fallback=True) -> ModelFacts
    known_model_types() -> tuple[str, ...]

Known families are counted analytically (families_decoder.py,
families_classic.py); any other model_type transformers knows is built on the
meta device (meta.py, imports torch lazily).
"""

from gpuplan.modelinfo.config_io import read_config
from gpuplan.modelinfo.count import model_facts
from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.modelinfo.registry import TASKS, known_model_types

__all__ = ["ModelConfigError", "ModelFacts", "TASKS", "known_model_types", "model_facts", "read_config"]
