"""What the planner knows about a model, read from its config.json without torch."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Literal


@dataclass(frozen=True)
class VisionFacts:
    """The image side of a vision-language model (modelinfo/vision_families.py), from its config.json.

    A parameter belongs to the first of projector, tower, language model whose module-name
    prefix (+ ".") starts its name (transformers 5.24 AutoModelForImageTextToText names);
    tower_params + projector_params + language_model_params == ModelFacts.n_params.
    The dims are the vision tower's (its encoder layers), for its activations and time.
    """

    family: str  # the VLM's model_type
    tower_modules: tuple[str, ...]
    projector_modules: tuple[str, ...]
    language_model_modules: tuple[str, ...]
    tower_params: int
    projector_params: int
    language_model_params: int
    hidden_size: int  # the tower's width
    num_layers: int
    num_attention_heads: int
    intermediate_size: int
    mlp: Literal["gated", "plain"]
    patch_size: int
    image_token_id: int | None
    # image-token geometry the config fixes (modelinfo/image_tokens.py reads it): merge / scale
    # factors, the tower's input size, fixed tokens per image
    geometry: tuple[tuple[str, Any], ...] = ()

    def geo(self, key: str) -> Any:
        return dict(self.geometry)[key]

    def summary(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "tower_params": self.tower_params,
            "projector_params": self.projector_params,
            "language_model_params": self.language_model_params,
            "tower_modules": list(self.tower_modules),
            "projector_modules": list(self.projector_modules),
            "language_model_modules": list(self.language_model_modules),
            "tower_hidden_size": self.hidden_size,
            "tower_layers": self.num_layers,
        }


@dataclass(frozen=True)
class ModelFacts:
    """Shapes and counts of one model for one task.

    n_params counts every trainable parameter of the model as transformers
    builds it for `task` (AutoModelForCausalLM / ...SequenceClassification /
    ...MaskedLM), tied weights counted once, equal to
    sum(p.numel() for p in model.parameters()) on the meta device.
    param_shapes lists each parameter tensor (tied ones once), for optimizers
    whose state depends on shape (bitsandbytes 8-bit, Adafactor).
    """

    model_type: str
    task: str
    n_params: int
    param_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    mlp: Literal["gated", "plain"]
    norm: Literal["rmsnorm", "layernorm"]
    tie_word_embeddings: bool
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    source: Literal["analytic", "meta-device"] = "analytic"
    # (module name, "linear" | "conv1d", in_features, out_features) of every nn.Linear and
    # transformers Conv1D, registration order: what LoRA can target (modelinfo/lora_targets.py)
    linear_layers: tuple[tuple[str, str, int, int], ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # mixture of experts (Mixtral: num_local_experts, num_experts_per_tok); 0 for a dense MLP
    num_experts: int = 0
    experts_per_token: int = 0
    # a vision-language model: its tower, projector and language model (the dims above are the
    # language model's); None for a text-only model
    vision: VisionFacts | None = None

    # The fields' hash, computed once per record: param_shapes holds a tuple per tensor (hundreds to thousands),
    # and the estimate's caches (plan/estimate/memory/layout.py) hash the record for every candidate the fit
    # search prices. Kept in the instance's __dict__ like the cached properties below; equality is the fields'.
    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(tuple(getattr(self, f.name) for f in fields(self)))
        return h

    # Derived once per record (a plan asks for them for every candidate the fit search prices); cached in the
    # instance's __dict__, outside the fields, so equality, replace() and the summary are unchanged.
    @cached_property
    def module_names(self) -> tuple[str, ...]:
        """Every module that holds a parameter (each dotted prefix of a parameter name); a tied
        causal-lm head is a module too, though its weight is listed once, as the embedding."""
        seen: dict[str, None] = {}
        for name, _ in self.param_shapes:
            parts = name.split(".")[:-1]
            for i in range(1, len(parts) + 1):
                seen.setdefault(".".join(parts[:i]), None)
        if self.task == "causal-lm" and self.tie_word_embeddings:
            seen.setdefault("lm_head", None)
        return tuple(seen)

    @cached_property
    def first_layer_linears(self) -> tuple[tuple[str, int, int], ...]:
        """(name, in_features, out_features) of the linear layers of the first block (the first number in a
        name is its layer's; every block has the same)."""
        out = []
        for name, _, fan_in, fan_out in self.linear_layers:
            if next((p for p in name.split(".") if p.isdigit()), None) == "0":
                out.append((name, fan_in, fan_out))
        return tuple(out)

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: all but the experts the router does not pick.
        Each expert is a gated MLP of 3 x hidden x intermediate weights (modeling_mixtral.py
        MixtralExperts: gate_up_proj 2i x h, down_proj h x i)."""
        if not self.num_experts:
            return self.n_params
        idle = self.num_experts - self.experts_per_token
        return self.n_params - self.num_layers * idle * 3 * self.hidden_size * self.intermediate_size

    def summary(self) -> dict[str, Any]:
        """The JSON-ready summary a Plan carries (no per-tensor list)."""
        return {
            "model_type": self.model_type,
            "task": self.task,
            "n_params": self.n_params,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "source": self.source,
            "notes": list(self.notes),
            **(
                {"num_experts": self.num_experts, "experts_per_token": self.experts_per_token, "active_params": self.active_params}
                if self.num_experts
                else {}
            ),
            **({"vision": self.vision.summary()} if self.vision is not None else {}),
        }
