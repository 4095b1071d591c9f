"""A user reward for specs/qwen2.5-7b-grpo-vllm.toml ([[rl.rewards]] kind = "function").

TRL 1.16 calls it with the prompts, the completions and every dataset column as keywords, one value per
completion (trl/trainer/grpo_trainer.py _calculate_rewards); gpuplan's plan reads this signature with
`ast` and never imports the file.
"""

import re


def one_number(prompts, completions, **kwargs):
    """1.0 when the completion holds exactly one number, else 0.0."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [1.0 if len(re.findall(r"\d+", t)) == 1 else 0.0 for t in texts]
