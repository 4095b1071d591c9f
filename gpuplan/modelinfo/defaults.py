"""Config defaults of the families counted analytically, copied from transformers.

A config.json may omit any key; transformers then uses the default of the
family's Config class. These tables are copies of those defaults from
transformers 5.24 (`transformers/models/<family>/configuration_<family>.py`,
the dataclass field defaults), so that planning never imports transformers.
tests/modelinfo/test_modelinfo_defaults.py compares every entry with the installed
transformers and fails when they drift. Only keys that change a parameter
shape, the tying, or a reported fact are copied. `None` means "derived": the
counter computes it as transformers' __post_init__ / modeling code does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.modelinfo.defaults_vision import VISION_DEFAULTS

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # configuration_llama.py (LlamaConfig); head_dim None -> hidden // heads,
    # num_key_value_heads None -> num_attention_heads (LlamaConfig.__post_init__).
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
    },
    # configuration_mistral.py (MistralConfig)
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
    },
    # configuration_qwen2.py (Qwen2Config); no head_dim field: the attention
    # reads getattr(config, "head_dim", hidden // heads) (modeling_qwen2.py).
    "qwen2": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
    },
    # configuration_qwen3.py (Qwen3Config); head_dim defaults to 128, not hidden // heads.
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
    },
    # configuration_gemma.py (GemmaConfig); ties embeddings by default.
    "gemma": {
        "vocab_size": 256000,
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
    },
    # configuration_gemma2.py (Gemma2Config)
    "gemma2": {
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
    },
    # configuration_phi3.py (Phi3Config); num_key_value_heads None -> heads.
    "phi3": {
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "resid_pdrop": 0.0,
        "attention_dropout": 0.0,
    },
    # configuration_phi.py (PhiConfig), the phi-1/1.5/2 architecture.
    "phi": {
        "vocab_size": 51200,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "qk_layernorm": False,
        "resid_pdrop": 0.0,
        "attention_dropout": 0.0,
    },
    # configuration_mixtral.py (MixtralConfig); experts are fused 3-D tensors.
    "mixtral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    # configuration_opt.py (OPTConfig); word_embed_proj_dim None -> hidden_size.
    "opt": {
        "vocab_size": 50272,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "ffn_dim": 3072,
        "max_position_embeddings": 2048,
        "do_layer_norm_before": True,
        "_remove_final_layer_norm": False,
        "word_embed_proj_dim": None,
        "dropout": 0.1,
        "attention_dropout": 0.0,
        "num_attention_heads": 12,
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": True,
    },
    # configuration_gpt2.py (GPT2Config); n_inner None -> 4 * n_embd (GPT2Block).
    "gpt2": {
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_inner": None,
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
    },
    # configuration_gpt_neox.py (GPTNeoXConfig), the Pythia architecture.
    "gpt_neox": {
        "vocab_size": 50432,
        "hidden_size": 6144,
        "num_hidden_layers": 44,
        "num_attention_heads": 64,
        "intermediate_size": 24576,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
    },
    # configuration_bert.py (BertConfig)
    "bert": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "is_decoder": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
    },
    # configuration_roberta.py (RobertaConfig)
    "roberta": {
        "vocab_size": 50265,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "is_decoder": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
    },
    **VISION_DEFAULTS,
}

# GPT2Config.attribute_map: the generic names a config may use for GPT-2 keys.
GPT2_ALIASES = {
    "n_embd": "hidden_size",
    "n_positions": "max_position_embeddings",
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
}


# Layers are counted one by one (a tensor list per layer), so a hostile depth would
# take minutes; the deepest published transformers have about 1,000 layers (DeepNet, 2022).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
MAX_LAYERS = 4096


class FamilyConfig:
    """A config mapping read with one family's defaults filled in.

    A key that is absent, or present as JSON null, takes the family default
    (`None` there means the counter derives it). Values are type-checked so
    that a bad config fails with the key named, not deep inside arithmetic.
    """

    def __init__(self, model_type: str, config: Mapping[str, Any], aliases: Mapping[str, str] | None = None) -> None:
        self.model_type = model_type
        self._config = config
        self._defaults = FAMILY_DEFAULTS[model_type]
        self._aliases = aliases or {}

    def given(self, key: str) -> bool:
        """Whether the config sets `key` (or its alias) to a non-null value."""
        alias = self._aliases.get(key)
        return self._config.get(key) is not None or (alias is not None and self._config.get(alias) is not None)

    def shown(self, key: str) -> str:
        """`key = value` for messages, saying when the value is the family default."""
        value = self.raw(key)
        if self.given(key):
            return f"{key} = {value!r}"
        return f"{key} = {value!r} (the {self.model_type} default; the key is absent)"

    def raw(self, key: str) -> Any:
        value = self._config.get(key)
        if value is None and key in self._aliases:
            value = self._config.get(self._aliases[key])
        if value is None:
            value = self._defaults.get(key)
        return value

    def int_or_none(self, key: str, *, minimum: int = 1) -> int | None:
        """A derived key: None when the config leaves it to the counter (the family default is None)."""
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _bad(self.model_type, key, value, f"an integer >= {minimum}")
        if key in LAYER_KEYS and value > MAX_LAYERS:
            raise _bad(self.model_type, key, value, f"an integer from {minimum} to {MAX_LAYERS}")
        return value

    def int(self, key: str, *, minimum: int = 1) -> int:
        """A key every config of the family has (given, or the family default)."""
        value = self.int_or_none(key, minimum=minimum)
        if value is None:
            raise _bad(self.model_type, key, None, f"an integer >= {minimum} (the key is required and has no {self.model_type} default)")
        return value

    def bool(self, key: str) -> bool:
        value = self.raw(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise _bad(self.model_type, key, value, "true or false")
        return value

    def float(self, key: str) -> float:
        value = self.raw(key)
        if value is None:
            return 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(self.model_type, key, value, "a number")
        return float(value)


def _bad(model_type: str, key: str, value: Any, expected: str) -> Exception:
    from gpuplan.modelinfo.errors import ModelConfigError

    return ModelConfigError(None, f"{model_type} config key {key!r} = {value!r} is invalid: expected {expected}")


def check_divides(cfg: FamilyConfig, key: str, by_key: str, value: int | None = None, by: int | None = None) -> None:
    """Raise when by_key does not divide key, as the modeling code would fail."""
    value = cfg.int(key) if value is None else value
    by = cfg.int(by_key) if by is None else by
    if value % by:
        from gpuplan.modelinfo.errors import ModelConfigError

        raise ModelConfigError(
            None,
            f"{cfg.model_type} config: {cfg.shown(key)} is not divisible by "
            f"{cfg.shown(by_key)}; choose them so that {by_key} divides {key}",
        )
