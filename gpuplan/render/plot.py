"""A picture of a run for `gpuplan show OUTPUT_DIR --plot FILE.png` (matplotlib, the `plot` extra).

Four panels: training and eval loss against step (with `gpuplan eval` results as stars; a dpo / kto run's reward
margin and a grpo / rloo run's mean reward per reward function on a second axis); tokens/s against step with the
plan's estimate as a line; peak memory measured beside the plan's estimate; mean
throughput measured beside the plan's. matplotlib is imported here only, through its
object API (Figure + the Agg canvas): no pyplot state, no display needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan.render.run_metrics import RunMetrics
from gpuplan.units import GIB

MEASURED, PLANNED, EVALUATED = "#1f77b4", "#ff7f0e", "#2ca02c"


def draw_run(state: Mapping[str, Any], metrics: RunMetrics, title: str) -> Any:
    """The matplotlib Figure of one run (state: gpuplan-state.json; metrics: metrics.jsonl)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plan, results = state["plan"], state.get("results") or {}
    fig = Figure(figsize=(11, 7.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    fig.suptitle(title, fontsize=11)
    _loss(axes[0][0], metrics, state.get("evaluations") or [])
    _throughput(axes[0][1], metrics, plan.get("throughput", {}).get("tokens_per_second"))
    _memory(axes[1][0], plan, results)
    _mean_throughput(axes[1][1], plan, results)
    return fig


def _loss(ax, m: RunMetrics, evaluations: list) -> None:
    if m.loss:
        ax.plot(m.train_steps, m.loss, color=MEASURED, marker="." if len(m.loss) < 50 else None, label="train loss")
    if m.eval_loss:
        ax.plot(m.eval_steps, m.eval_loss, color=PLANNED, marker="o", label="eval loss")
    scored = [
        (e["step"], e["eval_loss"]) for e in evaluations if isinstance(e.get("step"), int) and isinstance(e.get("eval_loss"), (int, float))
    ]
    if scored:  # `gpuplan eval` results (gpuplan-state.json "evaluations")
        steps, losses = zip(*scored)
        ax.scatter(steps, losses, color=EVALUATED, marker="*", s=120, zorder=3, label="gpuplan eval (held-out)")
    ax.set(title="Loss", xlabel="step", ylabel="loss")
    _integer_steps(ax)
    _legend_or_empty(ax, bool(m.loss or m.eval_loss or scored), "no loss logged")
    if m.rewards.get("margins"):  # dpo / kto: the reward margin (and accuracy) on a second axis
        twin = ax.twinx()
        for name, color in (("margins", PLANNED), ("accuracies", "#2ca02c")):
            if m.rewards.get(name):
                steps, values = zip(*m.rewards[name])
                twin.plot(steps, values, color=color, linestyle=":", label=f"reward {name}")
        twin.set(ylabel="reward margin / accuracy")
        twin.legend(loc="center right", fontsize=8)
    means = {k.removesuffix("/mean"): v for k, v in m.rewards.items() if k.endswith("/mean") and v}
    if means or m.rl.get("reward"):  # grpo / rloo: each reward's mean (its std as a band) and the weighted sum
        twin = ax.twinx()
        for name, points in means.items():
            steps, values = zip(*points)
            line = twin.plot(steps, values, linestyle=":", label=f"reward {name}")[0]
            std = dict(m.rewards.get(f"{name}/std") or [])
            if std:
                lo = [v - std.get(s, 0.0) for s, v in points]
                hi = [v + std.get(s, 0.0) for s, v in points]
                twin.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
        if m.rl.get("reward") and len(means) != 1:
            steps, values = zip(*m.rl["reward"])
            twin.plot(steps, values, color=PLANNED, label="reward (weighted sum)")
        twin.set(ylabel="reward (mean per completion)")
        twin.legend(loc="center right", fontsize=8)


def _throughput(ax, m: RunMetrics, planned: float | None) -> None:
    if m.tokens_per_second:
        steps, tps = zip(*m.tokens_per_second)
        ax.plot(steps, tps, color=MEASURED, marker="." if len(tps) < 50 else None, label="measured (per logging interval)")
    if planned:
        ax.axhline(planned, color=PLANNED, linestyle="--", label=f"plan estimate {planned:,.0f}")
    ax.set(title="Throughput", xlabel="step", ylabel="tokens/s")
    _integer_steps(ax)
    ax.set_ylim(bottom=0)
    _legend_or_empty(ax, bool(m.tokens_per_second or planned), "no throughput logged")


def _bars(ax, labels: list[str], values: list[float | None], unit: str, fmt: str) -> None:
    xs = range(len(labels))
    heights = [v or 0 for v in values]
    bars = ax.bar(xs, heights, color=[MEASURED, PLANNED, PLANNED][: len(labels)])
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel(unit)
    for bar, v in zip(bars, values):
        ax.annotate(
            "unknown" if v is None else fmt.format(v),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.margins(y=0.15)


def _memory(ax, plan: Mapping[str, Any], results: Mapping[str, Any]) -> None:
    mem = plan.get("memory", {})
    if "peak_allocated_bytes" in results:  # CUDA: torch.cuda.max_memory_allocated
        measured, what = results["peak_allocated_bytes"], "measured\n(max_memory_allocated)"
    else:  # CPU: the process's peak RSS, which also holds the interpreter and libraries
        measured, what = results.get("peak_rss_bytes"), "measured\n(process peak RSS)"
    values = [measured, mem.get("allocated_peak_bytes"), mem.get("reserved_peak_bytes")]
    _bars(ax, [what, "plan:\nallocated peak", "plan:\ndevice total"], [None if v is None else v / GIB for v in values], "GiB", "{:.2f} GiB")
    ax.set_title("Peak memory")


def _mean_throughput(ax, plan: Mapping[str, Any], results: Mapping[str, Any]) -> None:
    planned = plan.get("throughput", {}).get("tokens_per_second")
    _bars(ax, ["measured\n(whole training loop)", "plan estimate"], [results.get("tokens_per_second"), planned], "tokens/s", "{:,.0f}")
    ax.set_title("Throughput, whole run")


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_or_empty(ax, has_data: bool, empty: str) -> None:
    if has_data:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
