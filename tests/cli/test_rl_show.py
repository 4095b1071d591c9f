"""A grpo / rloo run's metrics.jsonl read back: TRL's RL metrics under TRL's names (render/run_metrics.py
RL_METRICS), a sparkline per reward and for KL / completion length in `gpuplan show`, each reward's mean on
the loss panel of `--plot`. The lines are shaped as apply/train/metrics.py writes them from TRL's logs."""

from __future__ import annotations

import json

import pytest

from gpuplan.render.run_metrics import METRICS_FILE, read_metrics
from gpuplan.render.state import rl_lines


def _write(tmp_path, n: int = 6) -> None:
    lines = []
    for step in range(1, n + 1):
        lines.append(
            {
                "event": "train",
                "step": step,
                "loss": 0.0,
                "rewards/lower/mean": 0.2 + 0.15 * step,
                "rewards/lower/std": 0.1,
                "rewards/answer/mean": 0.0,
                "rewards/answer/std": 0.0,
                "reward": 0.2 + 0.15 * step,
                "kl": 0.001 * step,
                "completions/mean_length": 4.0,
                "clip_ratio/region_mean": 0.0,
                "grad_norm": 1.0,  # not an RL metric: not read into .rl
            }
        )
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_rl_metrics_are_read_and_drawn_per_reward(tmp_path):
    _write(tmp_path)
    m = read_metrics(tmp_path)
    assert set(m.rl) == {"reward", "kl", "completions/mean_length", "clip_ratio/region_mean"}
    assert m.rewards["lower/mean"][-1] == (6, pytest.approx(1.1)) and "answer/std" in m.rewards
    shown = rl_lines(m.rl, m.rewards)
    assert shown[0].startswith("  reward lower ▁") and shown[0].endswith("0.350 -> 1.100 (mean of the last 5: 0.800)")
    assert [line.split()[0:2] for line in shown] == [
        ["reward", "lower"],
        ["reward", "answer"],
        ["reward", "(weighted"],
        ["kl", "to"],
        ["completion", "length"],
        ["clipped", "ratio"],
    ]


def test_the_plot_puts_each_rewards_mean_on_the_loss_panel(tmp_path):
    pytest.importorskip("matplotlib")
    from gpuplan.render.plot import draw_run

    _write(tmp_path)
    fig = draw_run({"plan": {}, "results": {}}, read_metrics(tmp_path), "grpo")
    labels = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert {"reward lower", "reward answer", "reward (weighted sum)", "train loss"} <= labels
