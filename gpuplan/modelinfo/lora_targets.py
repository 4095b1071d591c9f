"""LoRA targets and exact adapter parameter counts, without torch.

Matching follows peft 0.21 as apply runs it (LoraConfig with an explicit list):
- a layer is a target when its module name equals a listed name or ends with "." + name
  (peft/tuners/tuners_utils.py check_target_module_exists);
- layers inside a module of `modules_to_save` are not targeted (peft_model.py: the
  modules_to_save list guards target matching), and a module is saved when its name
  ends with a listed name (peft/utils/other.py _set_trainable: key.endswith(target_key));
- "all-linear" is every nn.Linear / Conv1D but the output embedding and, for
  sequence classification, the head (tuners_utils._maybe_include_all_linear_layers);
  the plan writes it out as the list of layer names peft then matches.
Counts (peft/tuners/lora/layer.py update_layer): lora_A = Linear(in, r, bias=False),
lora_B = Linear(r, out, bias=False): r * (in + out) per target; DoRA adds
lora_magnitude_vector of out_features values (tuners/lora/dora.py). A saved module
adds a trainable copy of its parameters (ModulesToSaveWrapper), counted by
get_nb_trainable_parameters beside the frozen original.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Any, TypeVar

from gpuplan.errors import OneProblem
from gpuplan.modelinfo.facts import ModelFacts

# The seq-cls heads peft's PeftModelForSequenceClassification saves (peft_model.py).
SEQ_CLS_HEADS = ("classifier", "score")
# Output embeddings that are nn.Linear modules in the analytic families (masked-lm, untied).
OUTPUT_LAYERS = frozenset({"cls.predictions.decoder", "lm_head.decoder"})


class TargetError(OneProblem, ValueError):
    """A target or saved-module name the model does not have; the message says what it has."""


_T = TypeVar("_T")


def _by_facts(compute: Callable[..., _T]) -> Callable[..., _T]:
    """`compute(facts, *args)` remembered for hashable arguments (lists given as tuples): a plan asks the same
    questions of the same record once per candidate it plans (the no-fit alternatives plan the spec again on
    every catalog GPU: plan/fit/hardware_alternatives.py). Records built with unhashable parts are computed."""
    cached = lru_cache(maxsize=256)(compute)

    def call(facts: ModelFacts, *args: Any) -> _T:
        try:
            return cached(facts, *args)
        except TypeError:  # unhashable: a record or an argument of lists
            return compute(facts, *args)

    return call


def _key(names: str | list[str] | tuple[str, ...] | None) -> Any:
    return names if names is None or isinstance(names, str) else tuple(names)


def peft_matches(module: str, target: str) -> bool:
    return module == target or module.endswith("." + target)


def module_names(facts: ModelFacts) -> list[str]:
    """Every module that holds a parameter (ModelFacts.module_names)."""
    return list(facts.module_names)


def module_params(facts: ModelFacts, module: str) -> int:
    """Parameters of a module; a saved tied head gets its own (vocab x hidden) copy."""
    n = sum(prod(s) if s else 1 for name, s in facts.param_shapes if name.startswith(module + "."))
    if n == 0 and module == "lm_head":
        n = facts.vocab_size * facts.hidden_size
    return n


def check_saved(facts: ModelFacts, names: list[str] | None) -> None:
    """Each modules_to_save name must end some module's name (peft matches by suffix)."""
    _check_saved(facts, _key(names))


@_by_facts
def _check_saved(facts: ModelFacts, names: tuple[str, ...] | None) -> None:
    modules = module_names(facts)
    short = list(dict.fromkeys(m.rsplit(".", 1)[-1] for m in modules))
    for n in names or []:
        if not any(m.endswith(n) for m in modules):
            close = difflib.get_close_matches(n, short, n=2, cutoff=0.5)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise TargetError(
                f"{n!r} matches no module of this {facts.model_type} model; {hint}"
                "modules_to_save takes module names such as lm_head or embed_tokens"
            )


def saved_modules(facts: ModelFacts, modules_to_save: list[str] | None) -> list[str]:
    """Modules wrapped by ModulesToSaveWrapper (outermost matches only)."""
    if not modules_to_save:
        return []
    found = [m for m in module_names(facts) if any(m.endswith(k) for k in modules_to_save)]
    return [m for m in found if not any(m.startswith(o + ".") for o in found if o != m)]


def default_modules_to_save(facts: ModelFacts, asked: list[str] | None) -> list[str] | None:
    """seq-cls: the head is trained in full, as peft's SEQ_CLS task adds it; else as asked."""
    if facts.task != "seq-cls":
        return asked
    names = set(module_names(facts))
    heads = [h for h in SEQ_CLS_HEADS if h in names]
    out = list(asked or [])
    return out + [h for h in heads if h not in out]


def lora_candidates(facts: ModelFacts, saved: list[str], excluded: tuple[str, ...] = ()) -> list[tuple[str, str, int, int]]:
    """Linear layers LoRA may target: not the output embedding, not inside a saved module or a seq-cls head,
    not under an `excluded` prefix (a VLM's frozen vision tower: peft's exclude_modules, plan/vision_settings.py)."""
    return list(_lora_candidates(facts, _key(saved), _key(excluded)))


@_by_facts
def _lora_candidates(facts: ModelFacts, saved: tuple[str, ...], excluded: tuple[str, ...]) -> tuple[tuple[str, str, int, int], ...]:
    heads = set(saved) | ({h for h in SEQ_CLS_HEADS} if facts.task == "seq-cls" else set()) | set(excluded)
    return tuple(
        layer
        for layer in facts.linear_layers
        if layer[0] not in OUTPUT_LAYERS and not any(layer[0] == h or layer[0].startswith(h + ".") for h in heads)
    )


def _suffixes(name: str) -> set[str]:
    """Every dotted suffix of a module name: exactly the targets peft_matches(name, target) accepts."""
    parts = name.split(".")
    return {".".join(parts[-k:]) for k in range(1, len(parts) + 1)}


def _unambiguous_suffix(name: str, taken: set[str]) -> str:
    """The shortest dotted suffix of a linear layer's name that matches no other kind of module (`taken`:
    the suffixes of those modules): its last part ("q_proj") unless that also ends a non-linear module
    (Qwen2-VL's merger.mlp.0 and .2 end in digits, as do the vision blocks.0 / blocks.2; peft refuses a
    target that is not a linear layer)."""
    parts = name.split(".")
    for k in range(1, len(parts) + 1):
        suffix = ".".join(parts[-k:])
        if suffix not in taken:
            return suffix
    return name


def resolve_targets(facts: ModelFacts, target_modules: str | list[str], saved: list[str], excluded: tuple[str, ...] = ()) -> list[str]:
    """The explicit list of names peft matches; raises TargetError for a name matching no linear layer."""
    return list(_resolve_targets(facts, _key(target_modules), _key(saved), _key(excluded)))


@_by_facts
def _resolve_targets(
    facts: ModelFacts, target_modules: str | tuple[str, ...], saved: tuple[str, ...], excluded: tuple[str, ...]
) -> tuple[str, ...]:
    layers = _lora_candidates(facts, saved, excluded)
    if target_modules == "all-linear":
        out: dict[str, None] = {}
        linear = {name for name, *_ in layers}
        # modules peft may match (those under an excluded prefix it skips first: exclude_modules)
        others = [m for m in module_names(facts) if m not in linear and not any(m == e or m.startswith(e + ".") for e in excluded)]
        taken = set().union(*(_suffixes(m) for m in others))  # one pass, not every layer against every module
        for name, *_ in layers:
            out.setdefault(_unambiguous_suffix(name, taken), None)
        return tuple(out)
    short = list(dict.fromkeys(name.rsplit(".", 1)[-1] for name, *_ in layers))
    for t in target_modules:
        if any(peft_matches(name, t) for name, *_ in layers):
            continue
        if any(peft_matches(m, t) for m in module_names(facts)):
            raise TargetError(
                f"{t!r} is not a linear layer of this {facts.model_type} model (LoRA is planned "
                f"on nn.Linear/Conv1D layers); its linear layers are {', '.join(short)}"
            )
        close = difflib.get_close_matches(t, short, n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise TargetError(f"{t!r} matches no layer of this {facts.model_type} model; {hint}its linear layers are {', '.join(short)}")
    return tuple(dict.fromkeys(target_modules))


@dataclass(frozen=True)
class AdapterCount:
    """Trainable parameters of a LoRA model, as peft's get_nb_trainable_parameters reports them."""

    per_target: dict[str, tuple[int, int]]  # target name -> (layers matched, adapter parameters)
    adapter_params: int  # lora_A + lora_B (+ DoRA magnitudes) over all targets
    saved_params: int  # trainable copies of modules_to_save
    base_params: int  # the model's own parameters, frozen
    target_layers: tuple[tuple[str, str, int, int], ...]  # the layers that get an adapter
    largest_target: int  # weights of the largest targeted layer (per-layer dequantization)

    @property
    def trainable_params(self) -> int:
        return self.adapter_params + self.saved_params

    @property
    def total_params(self) -> int:
        return self.base_params + self.trainable_params

    def to_dict(self) -> dict:
        return {
            "trainable_params": self.trainable_params,
            "adapter_params": self.adapter_params,
            "saved_params": self.saved_params,
            "total_params": self.total_params,
            "per_target": {k: {"layers": n, "params": p} for k, (n, p) in self.per_target.items()},
        }


def count_adapters(
    facts: ModelFacts, targets: list[str], r: int, use_dora: bool, saved: list[str], excluded: tuple[str, ...] = ()
) -> AdapterCount:
    """The adapters' parameters, layer by layer as peft adds them (one record per question: not to be changed)."""
    return _count_adapters(facts, _key(targets), r, use_dora, _key(saved), _key(excluded))


@_by_facts
def _count_adapters(
    facts: ModelFacts, targets: tuple[str, ...], r: int, use_dora: bool, saved: tuple[str, ...], excluded: tuple[str, ...]
) -> AdapterCount:
    layers = _lora_candidates(facts, saved, excluded)
    per: dict[str, tuple[int, int]] = {t: (0, 0) for t in targets}
    matched = []
    for layer in layers:
        name, _, fan_in, fan_out = layer
        hit = next((t for t in targets if peft_matches(name, t)), None)
        if hit is None:
            continue
        n = r * (fan_in + fan_out) + (fan_out if use_dora else 0)
        k, p = per[hit]
        per[hit] = (k + 1, p + n)
        matched.append(layer)
    saved_params = 0
    for m in saved_modules(facts, list(saved)):
        saved_params += module_params(facts, m)
    adapter = sum(p for _, p in per.values())
    largest = max((fi * fo for _, _, fi, fo in matched), default=0)
    return AdapterCount(per, adapter, saved_params, facts.n_params, tuple(matched), largest)
