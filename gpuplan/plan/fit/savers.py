"""The saver table: every memory saver the fit search may turn on, as one entry each.

An entry says what the saver is called in the plan (`name`) and in compare's column
(`short`), which fit knob it turns (`knob`, a field of search.Knobs) and to what (`value`),
the spec key that sets it (`setting`), what it costs in step time (`cost`, the words the plan
prints), where it can run (`available`) and which earlier savers it supersedes
(`supersedes`: Adafactor replaces the 8-bit optimizer's states). Undoing a saver puts its
knob back to the spec's value, so the search, the pruning, the saved-bytes accounting, the
no-fit fixes, compare and the rules all iterate this table instead of naming savers.

The fit ladder tries them cheapest slowdown first (`slowdown`, a fraction of the step; the
table's order breaks ties): the HF GPU training guide: 8-bit states cost no measurable time,
emptying the cache about 10%, checkpointing about 20%, Adafactor slows convergence (last);
chunked cross-entropy one more output-head forward, 2 x hidden x vocab FLOPs per token over
the step's (estimate/memory/loss_chunking.py: a few % for 1B+ models, so before checkpointing).
Adding a saver = one entry here plus its memory effect in estimate/memory and its time
effect in estimate/throughput.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuplan.plan.estimate.memory import loss_chunking
from gpuplan.plan.methods import method_of
from gpuplan.spec.objectives import PRECOMPUTED_REFERENCE, PRECOMPUTED_REFERENCE_COST

if TYPE_CHECKING:
    from gpuplan.plan.fit.search import FitProblem, Knobs, Sharding

EIGHT_BIT = "adamw_bnb_8bit"
ADAFACTOR = "adafactor"
EMPTY_CACHE_STEPS = 4  # the guide's example value


@dataclass(frozen=True)
class SaverSpec:
    name: str  # the words the plan uses: "gradient checkpointing"
    short: str  # compare's savers column: "ckpt"
    knob: str  # the search.Knobs field it turns, also its `auto` key
    setting: str  # the spec key that sets it by hand
    value: Any  # the knob's value with the saver on
    cost: str  # its step-time cost, as the plan prints it
    available: Callable[[FitProblem, Sharding], bool]
    supersedes: tuple[str, ...] = ()  # earlier savers this one replaces on the ladder
    slowdown: Callable[[FitProblem], float] = lambda p: 0.0  # fraction of the step; orders the ladder

    def is_on(self, knobs: Knobs) -> bool:
        return getattr(knobs, self.knob) == self.value


def _full_weights(p: FitProblem) -> bool:
    # adapters: their optimizer states are a few hundred MiB at most, so 8-bit states and
    # Adafactor buy almost nothing there and are not used for memory (rules/optimizer.py says so)
    return not method_of(p.base.adapters).frozen_base


def _eight_bit(p: FitProblem, sh: Sharding) -> bool:
    # bitsandbytes' 8-bit states do not shard under FSDP/DeepSpeed (axolotl refuses the pair)
    return p.eight_bit_available and sh.engine in ("none", "ddp") and _full_weights(p)


EIGHT_BIT_OPTIMIZER = SaverSpec(
    "8-bit optimizer",
    "8bit-adam",
    "optim",
    "training.optim",
    EIGHT_BIT,
    "no measurable step-time cost; Adam states 8 -> ~2 bytes per parameter (bitsandbytes)",
    _eight_bit,
)


def flops_per_token_at(p: FitProblem) -> float:
    """Hardware FLOPs per token without recomputation (estimate/throughput.py): what slowdowns divide."""
    from gpuplan.plan.estimate.flops import flops_per_token
    from gpuplan.plan.estimate.step_time.shape import saved_linear_params

    hw = flops_per_token(p.facts, p.base.seq_len, False, method_of(p.base.adapters).frozen_base)[1]
    return hw + 2 * saved_linear_params(p.facts, p.base.adapters)  # a saved head's dW, as the plan counts it


def _chunk_slowdown(p: FitProblem) -> float:
    return loss_chunking.cost_fraction(p.facts.hidden_size, p.facts.vocab_size, flops_per_token_at(p))


CHUNKED_LOSS = SaverSpec(
    loss_chunking.NAME,
    "chunked-ce",
    "loss_chunk_size",
    loss_chunking.KEY,
    loss_chunking.CHUNK_TOKENS,
    "the output head's forward runs once more per chunk in backward",
    # "loss_chunk_size" is in `auto` only where the model's forward can take it (rules/memory.py)
    # dpo / kto: TRL's fused log-prob head never builds the logits, so there is nothing to chunk
    lambda p, sh: p.base.task == "causal-lm" and p.base.objective == "sft",
    slowdown=_chunk_slowdown,
)
CACHE_EMPTYING = SaverSpec(
    "cache emptying",
    "empty-cache",
    "torch_empty_cache_steps",
    "training.torch_empty_cache_steps",
    EMPTY_CACHE_STEPS,
    "about 10% slower (the guide); frees the allocator's cached blocks",
    lambda p, sh: p.base.device == "cuda",
    slowdown=lambda p: 0.10,
)
CHECKPOINTING = SaverSpec(
    "gradient checkpointing",
    "ckpt",
    "gradient_checkpointing",
    "training.gradient_checkpointing",
    True,
    "about 20% slower (the guide): one extra forward",
    lambda p, sh: True,
    slowdown=lambda p: 0.20,
)
ADAFACTOR_OPTIMIZER = SaverSpec(
    "Adafactor",
    "adafactor",
    "optim",
    "training.optim",
    ADAFACTOR,
    "factored second moments, no first moment: slower convergence (the guide)",
    lambda p, sh: _full_weights(p),
    supersedes=("8-bit optimizer",),
    slowdown=lambda p: float("inf"),
)  # convergence, not speed: the last resort

SAVERS: tuple[SaverSpec, ...] = (EIGHT_BIT_OPTIMIZER, CHUNKED_LOSS, CACHE_EMPTYING, CHECKPOINTING, ADAFACTOR_OPTIMIZER)
BY_NAME = {s.name: s for s in SAVERS}
KNOBS: tuple[str, ...] = tuple(dict.fromkeys(s.knob for s in SAVERS))  # each fit knob once, ladder order


def saver(name: str) -> SaverSpec:
    return BY_NAME[name]


def user_saver_label(knob: str, value: Any) -> str | None:
    """What a knob the spec set by hand saves, in the no-fit message's words (None: nothing).
    The optimizer is named itself: any 8-bit optimizer or Adafactor the spec picked saves memory."""
    if knob == "optim":
        return value if value in (EIGHT_BIT, ADAFACTOR) or "8bit" in value else None
    if not value:
        return None
    return next(s.name for s in SAVERS if s.knob == knob)


def set_by_spec(settings: Mapping[str, Any]) -> list[str]:
    """The savers the spec itself turns on (its own values, not the fit search's), ladder order:
    what compare shows beside the ones the search added. `settings`: the plan's Setting objects."""
    out = []
    for s in SAVERS:
        setting = settings.get(s.setting)
        if setting is None or setting.source != "user":
            continue
        value = setting.value
        on = (
            (value == s.value or (s is EIGHT_BIT_OPTIMIZER and isinstance(value, str) and "8bit" in value))
            if s.knob == "optim"
            else bool(value)
        )
        if on and s.name not in out:
            out.append(s.name)
    return out


def short_name(name: str) -> str:
    """compare's column word for a saver (the name itself for one not in the table)."""
    spec = BY_NAME.get(name)
    return spec.short if spec else name


def saver_cost(name: str, weight_dtype: str, problem: FitProblem | None = None) -> str:
    """The saver's cost words, with the 8-bit optimizer's saving for this weight dtype: AdamW
    keeps two states in the weights' dtype (estimate/memory/states.py), bitsandbytes ~2 bytes;
    chunked cross-entropy's slowdown for this model (estimate/memory/loss_chunking.py)."""
    if name == CHUNKED_LOSS.name and problem is not None:
        f = problem.facts
        return loss_chunking.cost_wording(f.hidden_size, f.vocab_size, flops_per_token_at(problem))
    if name == EIGHT_BIT_OPTIMIZER.name:
        adam = 2 * {"float32": 4}.get(weight_dtype, 2)
        return f"no measurable step-time cost; Adam states {adam} -> ~2 bytes per parameter (bitsandbytes)"
    if name == PRECOMPUTED_REFERENCE:  # outside the ladder: rules/preference.py fit_with_reference
        return PRECOMPUTED_REFERENCE_COST
    return BY_NAME[name].cost
