"""Each local preference row's sequence length in tokens, read at plan time, for the padded step.

TRL 1.16 appends the tokenizer's eos_token to each plain-text answer that does not end with it
(trl/trainer/dpo_trainer.py and kto_trainer.py `_prepare_dataset` `add_eos`; the plan counts it for
every answer), then tokenizes a DPO row
as prompt + chosen and prompt + rejected, each whole with the tokenizer's special tokens
(dpo_trainer.py `tokenize_fn`, trl/data_utils.py `_tokenize`), a KTO row as prompt + completion
(kto_trainer.py), and its collator truncates every
sequence to max_length before padding the micro-batch to its longest (plan/estimate/padding.py). The
length an example puts in the padded tensor is therefore, in tokens:

    dpo: max(min(prompt + chosen, max_length), min(prompt + rejected, max_length))
    kto: min(prompt + completion, max_length)

(KTO's KL sequences, a prompt with another row's completion, are padded in a tensor of their own;
they are priced at the same length, the plan's nograd_forward terms scaling the policy's.)

Tokens are counted as spec/data_steps.py `token_counter` counts them (the model directory's
tokenizer.json, or the byte-level tokenizer of a model trained from scratch), plus the ids the
post-processor adds and the one EOS id (when the tokenizer names an eos_token); otherwise estimated
at 4 bytes per token, plus the EOS. Local .jsonl / .json / .csv training
files up to data_steps.COUNT_LIMIT bytes are read; Hub datasets, parquet, conversational rows (the
chat template's tokens are apply's to count) and unusable rows (the plan reports those) give None,
and the step is priced at full length. An eval_fraction split takes a random subset of the rows out,
which leaves the distribution of the lengths as it was: all rows are counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuplan.errors import GpuplanError
from gpuplan.plan.estimate.padding import ExampleLengths
from gpuplan.spec.data_format import read_rows
from gpuplan.spec.data_steps import _COUNTED, COUNT_LIMIT, ESTIMATED, estimated_tokens, token_counter
from gpuplan.spec.objectives import objective


def example_lengths(values: Mapping[str, Any], spec_dir: str, *, source: str | None, from_scratch: bool) -> ExampleLengths | None:
    """The training examples' padded lengths (module docstring), or None when the plan cannot read them."""
    obj = objective(values.get("training.objective") or "sft")
    files = values.get("data.train_files") or []
    if not obj.is_preference or values.get("data.dataset") or not files or (values.get("data.format") or "text") == "chat":
        return None
    max_length = values.get("preference.max_length")
    if not isinstance(max_length, int) or max_length < 1:
        return None
    paths = [Path(spec_dir, f) for f in files]
    if any(p.suffix.lower() not in _COUNTED or not p.is_file() for p in paths) or sum(p.stat().st_size for p in paths) > COUNT_LIMIT:
        return None
    try:
        rows = [r for p in paths for r in read_rows(p, str(p), n=2**62)]
    except GpuplanError:
        return None
    answers = [f for f in obj.example_fields if f not in ("prompt", "label")]  # dpo: chosen, rejected; kto: completion
    texts: list[list[str]] = []
    for row in rows:
        if not isinstance(row, Mapping) or not all(isinstance(row.get(f), str) for f in ("prompt", *answers)):
            return None  # conversational or unusable: apply counts them, the plan's row check reports them
        texts.append([row["prompt"] + row[a] for a in answers])
    if not texts:
        return None
    flat = [t for ts in texts for t in ts]
    counter = token_counter(source, from_scratch)
    if counter is None:
        counts, how = [estimated_tokens(t) + 1 for t in flat], ESTIMATED  # + the EOS TRL appends
    else:
        counts, how = [n + counter.specials + counter.eos for n in counter.tokens(flat)], counter.how
    per = len(answers)
    lengths = tuple(sorted(max(min(n, max_length) for n in counts[i : i + per]) for i in range(0, len(counts), per)))
    where = ", ".join(p.name for p in paths)
    return ExampleLengths(lengths, f"the {len(lengths):,} rows of {where}, tokens {how}")
