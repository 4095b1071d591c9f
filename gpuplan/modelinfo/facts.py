"""What the planner knows about a model, read from its config.json without torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


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
        }
