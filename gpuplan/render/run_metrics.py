"""A run's metrics.jsonl (apply/train/metrics.py) read back for `gpuplan show`: pure reading, no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gpuplan.lifecycle.run_dir import METRICS_FILE

# The metrics TRL 1.16's GRPOTrainer and RLOOTrainer log beside the loss (trl/trainer/grpo_trainer.py and
# rloo_trainer.py, `_generate_and_score_completions` and `_compute_loss`), under their names; each reward's
# rewards/<name>/mean and rewards/<name>/std come on top. kl only when beta != 0; the clip ratios of the
# clipped losses (grpo, bnpo, dr_grpo, dapo, luspo; rloo), cispo_clip_ratio of cispo.
RL_METRICS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "cispo_clip_ratio",
)


@dataclass
class RunMetrics:
    train_steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    tokens_per_second: list[tuple[int, float]] = field(default_factory=list)  # (step, tokens/s)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    # dpo / kto: TRL's rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies -> [(step, value)];
    # grpo / rloo: rewards/<name>/mean and rewards/<name>/std -> "<name>/mean", "<name>/std"
    rewards: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    rl: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # grpo / rloo: RL_METRICS by step
    samples: list[dict] = field(default_factory=list)  # [eval] sample_prompts: {step, at, prompt, completion}


def read_metrics(output_dir: str | Path) -> RunMetrics:
    """The train, eval and sample lines of output_dir/metrics.jsonl; lines that do not parse are skipped
    (a run killed mid-write leaves half a line)."""
    m = RunMetrics()
    path = Path(output_dir) / METRICS_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return m
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict):
            continue
        if r.get("event") == "train" and isinstance(r.get("loss"), (int, float)):
            m.train_steps.append(int(r["step"]))
            m.loss.append(float(r["loss"]))
            for k, v in r.items():
                if k.startswith("rewards/") and isinstance(v, (int, float)):
                    m.rewards.setdefault(k.removeprefix("rewards/"), []).append((int(r["step"]), float(v)))
                elif k in RL_METRICS and isinstance(v, (int, float)):
                    m.rl.setdefault(k, []).append((int(r["step"]), float(v)))
            if isinstance(r.get("tokens_per_second"), (int, float)):
                m.tokens_per_second.append((int(r["step"]), float(r["tokens_per_second"])))
        elif r.get("event") == "eval" and isinstance(r.get("eval_loss"), (int, float)):
            m.eval_steps.append(int(r["step"]))
            m.eval_loss.append(float(r["eval_loss"]))
        elif r.get("event") == "sample" and isinstance(r.get("completion"), str):
            m.samples.append(r)
    return m
