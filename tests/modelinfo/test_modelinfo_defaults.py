"""The copied config defaults (gpuplan/modelinfo/defaults.py) equal transformers'."""

from __future__ import annotations

import dataclasses

import pytest

from gpuplan.modelinfo.defaults import FAMILY_DEFAULTS

pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", sorted(FAMILY_DEFAULTS))
def test_defaults_match_transformers_config_class(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = {f.name: f.default for f in dataclasses.fields(CONFIG_MAPPING[model_type])}
    for key, value in FAMILY_DEFAULTS[model_type].items():
        if key == "head_dim" and key not in fields:
            continue  # qwen2/phi3/phi: no field; attention uses getattr(config, "head_dim", ...)
        assert key in fields, f"{model_type}.{key} is not a config field"
        assert fields[key] == value, f"{model_type}.{key}: transformers {fields[key]!r}, ours {value!r}"
