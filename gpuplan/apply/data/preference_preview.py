"""`gpuplan data` for dpo / kto rows: each pair's chosen and rejected sequence (KTO: the completion
with its label; KTO on pairs: both, desirable and undesirable), the prompt masked and the answer trained, from the token ids TRL trains on.

TRL 1.16 dpo_trainer.py `_prepare_dataset` tokenizes prompt and prompt + answer with
trl/data_utils.py `_tokenize` (conversational rows through the chat template; plain answers
get the EOS token appended), and the answer starts where the two token lists diverge
(`common_prefix_length`); the collator truncates prompt + answer to max_length (keep_start).
This module does exactly that for the first rows, so what it shows is what trains.
Returned in the shape of apply/data/preview.py (`gpuplan data --json`), each example with a
"kind" (chosen / rejected / desirable / undesirable).
"""

from __future__ import annotations

from typing import Any

from gpuplan.apply.data.examples import segments_of
from gpuplan.plan.types import Plan


def preview_preference(plan: Plan, tokenizer: Any, n_examples: int) -> dict[str, Any]:
    from trl.data_utils import _tokenize, common_prefix_length, is_conversational

    from gpuplan.apply.data.prepare import cache_dir, load_rows, train_paths
    from gpuplan.apply.train.preference import check_rows, objective_of, preference_run

    obj = objective_of(plan)
    check_rows(plan, tokenizer)  # an unusable row is an error here as in apply
    raw, _ = load_rows(train_paths(plan), "data.train_files", cache_dir(plan))
    limit = preference_run(plan).max_length
    # kto on pairs: each row's chosen and rejected completions, the two examples TRL unpairs it into
    # (apply/train/preference.py unpaired), shown row by row
    paired = obj.labelled_completions and {"chosen", "rejected"} <= set(raw.column_names)
    answers = ("chosen", "rejected") if obj.paired or paired else ("completion",)
    unpaired_kind = {"chosen": "desirable", "rejected": "undesirable"}
    examples: list[dict[str, Any]] = []
    tokens = trained = truncated = sequences = 0
    for i, row in enumerate(raw):
        chat = is_conversational(row)
        prompt_ids = _tokenize(tokenizer, row["prompt"], **({"add_generation_prompt": True} if chat else {}))["input_ids"]
        for field in answers:
            answer = row[field]
            if not chat and not answer.endswith(tokenizer.eos_token or ""):
                answer += tokenizer.eos_token or ""
            full = _tokenize(tokenizer, row["prompt"] + answer)["input_ids"]
            cut = min(common_prefix_length(prompt_ids, full), len(prompt_ids))
            ids = full[:limit]
            mask = [j >= cut for j in range(len(ids))]
            sequences += 1
            tokens += len(ids)
            trained += sum(mask)
            truncated += len(full) > limit
            if len(examples) < n_examples * len(answers):
                if obj.paired:
                    kind = field
                else:
                    kind = unpaired_kind[field] if paired else ("desirable" if row["label"] else "undesirable")
                examples.append(
                    {
                        "row": i,
                        "kind": kind,
                        "tokens": len(ids),
                        "truncated": len(full) > limit,
                        "segments": segments_of(ids, mask, tokenizer),
                    }
                )
    stats = {
        "rows": len(raw),
        "examples": len(raw) * (2 if paired else 1),
        "dropped_rows": 0,
        "truncated_rows": truncated,
        "tokens": tokens,
        "trained_tokens": trained,
        "sequences": sequences,
        "seq_len": limit,
        "packing": False,
        "packing_efficiency": None,
    }
    return {"examples": examples, "stats": stats}
