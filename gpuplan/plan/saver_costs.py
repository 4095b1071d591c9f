"""What each memory saver costs in speed: the wording the plan prints and the fractions that
order the fit search's savers (plan/solve.py), cheapest slowdown first.

The guide (hf-gpu-training-guide.txt): cache emptying ~10% slower, gradient checkpointing
~20%; bitsandbytes' 8-bit AdamW step costs about what AdamW's does; chunked cross-entropy
one more head forward per chunk (memory/loss_chunking.py).
"""

from __future__ import annotations

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.memory import loss_chunking


def saver_cost(name: str, weight_dtype: str, facts: ModelFacts | None = None, frozen: bool = False,
               seq_len: int = 2048) -> str:
    """SAVER_COST, with the 8-bit optimizer's saving for this weight dtype: AdamW keeps two
    states in the weights' dtype (plan/memory/states.py), bitsandbytes ~2 bytes; chunked
    cross-entropy's slowdown for this model (memory/loss_chunking.py)."""
    if name == loss_chunking.NAME and facts is not None:
        return loss_chunking.cost_wording(facts.hidden_size, facts.vocab_size, flops_per_token_at(facts, seq_len, frozen))
    if name == "8-bit optimizer":
        adam = 2 * {"float32": 4}.get(weight_dtype, 2)
        return f"no measurable step-time cost; Adam states {adam} -> ~2 bytes per parameter (bitsandbytes)"
    return SAVER_COST[name]


SAVER_COST = {
    "8-bit optimizer": "no measurable step-time cost; Adam states 8 -> ~2 bytes per parameter (bitsandbytes)",
    "cache emptying": "about 10% slower (the guide); frees the allocator's cached blocks",
    "gradient checkpointing": "about 20% slower (the guide): one extra forward",
    "Adafactor": "factored second moments, no first moment: slower convergence (the guide)",
    loss_chunking.NAME: "the output head's forward runs once more per chunk in backward",
}
# Slowdowns as fractions of the step, to order the savers (the guide: cache emptying ~10%,
# checkpointing ~20%); the 8-bit optimizer's step costs about what AdamW's does.
SAVER_SLOWDOWN = {"8-bit optimizer": 0.0, "cache emptying": 0.10, "gradient checkpointing": 0.20}


def flops_per_token_at(facts: ModelFacts, seq_len: int, frozen: bool) -> float:
    """Hardware FLOPs per token without recomputation (plan/throughput.py): what saver slowdowns divide."""
    from gpuplan.plan.throughput import flops_per_token

    return flops_per_token(facts, seq_len, False, frozen)[1]
