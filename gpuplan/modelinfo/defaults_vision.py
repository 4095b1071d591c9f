"""Config defaults of the vision-language families counted analytically, copied from transformers.

As defaults.py, for the sub-configs a VLM's config.json holds (text_config, vision_config, or the
text keys flat at the top level as Hub configs saved before transformers 5 have them): copies of
the dataclass field defaults of transformers 5.24's
`transformers/models/<family>/configuration_<family>.py`; tests/modelinfo/test_modelinfo_defaults.py
compares each entry with the installed transformers.
"""

from __future__ import annotations

from typing import Any

_QWEN_VL_TEXT: dict[str, Any] = {
    "vocab_size": 152064,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "attention_dropout": 0.0,
}

VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    # configuration_qwen2_vl.py (Qwen2VLConfig, Qwen2VLTextConfig, Qwen2VLVisionConfig)
    "qwen2_vl": {"image_token_id": 151655, "tie_word_embeddings": False},
    "qwen2_vl_text": dict(_QWEN_VL_TEXT),
    "qwen2_vl_vision": {
        "depth": 32,
        "embed_dim": 1280,
        "hidden_size": 3584,  # the merger's output: the language model's width
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    # configuration_qwen2_5_vl.py (Qwen2_5_VLConfig, Qwen2_5_VLTextConfig, Qwen2_5_VLVisionConfig)
    "qwen2_5_vl": {"image_token_id": 151655, "tie_word_embeddings": False},
    "qwen2_5_vl_text": dict(_QWEN_VL_TEXT),
    "qwen2_5_vl_vision": {
        "depth": 32,
        "hidden_size": 3584,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "out_hidden_size": 3584,
    },
}
