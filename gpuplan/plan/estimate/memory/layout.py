"""Per-model counts the peak model needs, computed once per ModelFacts (cached).

From ModelFacts.param_shapes (names as transformers gives them): parameters inside
the repeated blocks (names with a numeric path component, e.g. model.layers.3.*),
the LM head matrix (vocab x hidden, present whether or not it is tied), and the
parameters autocast casts to 16 bits in the forward (weights and biases of linear
layers: every >= 2-D parameter except the embeddings, plus 1-D parameters that are
not norm weights; the tied LM head is cast for its matmul too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from math import prod

from gpuplan.modelinfo.facts import ModelFacts

_LAYER = re.compile(r"\.(\d+)\.")
_NORM = re.compile(r"norm|ln_|LayerNorm|layernorm", re.IGNORECASE)
_EMBED = re.compile(r"embed|wte|wpe|word_embeddings|position_embeddings|token_type_embeddings|embed_in", re.IGNORECASE)


@dataclass(frozen=True)
class ModelLayout:
    layer_params: int  # all parameters of all repeated blocks
    head_params: int  # vocab x hidden: the LM head's weight gradient
    cast_params: int  # parameters autocast copies to 16 bits per forward
    n_tensors: int
    largest_tensor: int


def model_layout(facts: ModelFacts) -> ModelLayout:
    try:
        return _cached_layout(facts)
    except TypeError:  # facts built with unhashable parts (lists): compute, uncached
        return _layout(facts)


@lru_cache(maxsize=256)
def _cached_layout(facts: ModelFacts) -> ModelLayout:
    return _layout(facts)


def _layout(facts: ModelFacts) -> ModelLayout:
    layer = cast = 0
    largest = 0
    for name, shape in facts.param_shapes:
        n = prod(shape) if shape else 1
        largest = max(largest, n)
        if _LAYER.search(name):
            layer += n
        if len(shape) >= 2 and not _EMBED.search(name):
            cast += n
        elif len(shape) == 1 and not _NORM.search(name) and not _EMBED.search(name):
            cast += n
    head = facts.vocab_size * facts.hidden_size if facts.task != "seq-cls" else 0
    if facts.tie_word_embeddings and head:
        cast += head  # the tied head casts the embedding matrix for its matmul
    return ModelLayout(layer, head, cast, len(facts.param_shapes), largest)
