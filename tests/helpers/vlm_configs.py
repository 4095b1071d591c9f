"""Small config.json dicts of each vision-language family gpuplan plans (transformers 5.24 keys),
for tests that build them on the meta device or for real: a few layers, narrow widths."""

from __future__ import annotations

from typing import Any

# a language model of two decoder layers of width 64 with grouped-query attention
TEXT_64 = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
}
_LLAMA_TEXT = {"model_type": "llama", **TEXT_64}
_CLIP = {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}

TINY_VLM_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2_vl": {
        "model_type": "qwen2_vl",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1024,
        "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4, "mlp_ratio": 2},
    },
    "qwen2_5_vl": {
        "model_type": "qwen2_5_vl",
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "vocab_size": 999,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        },
        "tie_word_embeddings": True,
        "vision_config": {
            "depth": 3,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
        },
    },
    "llava": {"model_type": "llava", "text_config": dict(_LLAMA_TEXT), "vision_config": dict(_CLIP, image_size=56, patch_size=14)},
    "llava_next": {
        "model_type": "llava_next",
        "text_config": dict(_LLAMA_TEXT),
        "vision_config": dict(_CLIP, image_size=56, patch_size=14),
    },
    "idefics3": {
        "model_type": "idefics3",
        "text_config": dict(_LLAMA_TEXT),
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 56,
            "patch_size": 14,
        },
        "scale_factor": 2,
    },
    "smolvlm": {
        "model_type": "smolvlm",
        "text_config": dict(_LLAMA_TEXT),
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 56,
            "patch_size": 14,
        },
        "scale_factor": 2,
    },
    "gemma3": {
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 1024,
        },
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 56,
            "patch_size": 14,
        },
        "mm_tokens_per_image": 4,
    },
    "mllama": {
        "model_type": "mllama",
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 1024,
            "cross_attention_layers": [1, 3],
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_global_layers": 1,
            "attention_heads": 4,
            "image_size": 56,
            "patch_size": 14,
            "vision_output_dim": 64,
            "intermediate_layers_indices": [0, 1],
        },
    },
}
