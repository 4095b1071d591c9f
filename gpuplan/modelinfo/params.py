"""A list of parameter tensors, built the way torch.nn modules register them.

Shapes follow torch: nn.Linear(in, out) has weight (out, in) and bias (out,);
nn.Embedding(n, d) has weight (n, d); nn.LayerNorm(d) weight and bias (d,);
transformers' Conv1D(nf, nx) (GPT-2) stores weight (nx, nf) and bias (nf,)
(transformers/pytorch_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Shape = tuple[int, ...]


class ParamList:
    """Ordered (name, shape) pairs, in module registration order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Shape]] = []
        self.notes: list[str] = []  # facts the counter wants the plan to show
        self.experts: dict[str, int] = {}  # num_experts, experts_per_token of a mixture of experts
        # (module name, "linear" | "conv1d", in_features, out_features): the layers peft's
        # LoRA can target (tuners/lora/layer.py dispatch_default: nn.Linear and Conv1D)
        self.layers: list[tuple[str, str, int, int]] = []

    def add(self, name: str, *shape: int) -> None:
        self.items.append((name, tuple(shape)))

    def linear(self, name: str, in_features: int, out_features: int, bias: bool) -> None:
        self.layers.append((name, "linear", in_features, out_features))
        self.add(f"{name}.weight", out_features, in_features)
        if bias:
            self.add(f"{name}.bias", out_features)

    def conv1d(self, name: str, nf: int, nx: int) -> None:
        self.layers.append((name, "conv1d", nx, nf))
        self.add(f"{name}.weight", nx, nf)
        self.add(f"{name}.bias", nf)

    def embedding(self, name: str, num: int, dim: int) -> None:
        self.add(f"{name}.weight", num, dim)

    def norm(self, name: str, dim: int, bias: bool) -> None:
        self.add(f"{name}.weight", dim)
        if bias:
            self.add(f"{name}.bias", dim)

    def extend_renamed(self, src: ParamList, old: str, new: str) -> None:
        """src's tensors and linear layers, appended with a leading `old` of each name replaced by
        `new` (a decoder nested in a larger model: model. -> model.language_model.)."""

        def name(n: str) -> str:
            return new + n[len(old) :] if n.startswith(old) else n

        self.items.extend((name(n), s) for n, s in src.items)
        self.layers.extend((name(n), kind, fi, fo) for n, kind, fi, fo in src.layers)

    def total(self) -> int:
        n = 0
        for _, shape in self.items:
            size = 1
            for d in shape:
                size *= d
            n += size
        return n


@dataclass(frozen=True)
class Dims:
    """The architecture facts a family counter reads from a config."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    mlp: Literal["gated", "plain"]  # gated: SwiGLU/GeGLU (gate, up, down); plain: fc1, act, fc2
    norm: Literal["rmsnorm", "layernorm"]
    tie_word_embeddings: bool
    hidden_dropout: float
    attention_dropout: float
