"""`gpuplan show OUTPUT_DIR`: the loss sparkline, and `--plot FILE.png` drawn with matplotlib (issue 15)."""

import json
import os

import pytest

from gpuplan.lifecycle.state import STATE_FILE
from gpuplan.render.run_metrics import METRICS_FILE, read_metrics
from gpuplan.render.sparkline import BLOCKS, sparkline
from tests.helpers.cli_runs import gpuplan
from tests.helpers.planning import plan_text, spec

LOSSES = [5.6, 4.0, 3.1, 2.2, 1.8, 1.5, 1.3, 1.2]


def test_sparkline_scales_between_the_lowest_and_highest_block():
    assert sparkline([0.0, 7.0]) == "▁█"
    assert sparkline([7, 6, 5, 4, 3, 2, 1, 0]) == BLOCKS[::-1]
    assert sparkline([2.0, 2.0, 2.0]) == "▄▄▄"
    assert sparkline([]) == "" and sparkline([None, float("nan")]) == ""
    assert len(sparkline(list(range(1000)), width=60)) == 60


def test_the_metrics_file_name_matches_what_apply_writes():
    from gpuplan.apply.train.metrics import METRICS_FILE as written

    assert METRICS_FILE == written


def _run_dir(tmp_path):
    """An output dir as apply leaves it: the state (with a real plan) and metrics.jsonl."""
    plan = plan_text(
        tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 128", training="effective_batch_size = 16\nmax_steps = 80")
    )
    out = tmp_path / "run"
    out.mkdir()
    results = {
        "peak_rss_bytes": 700 * 2**20,
        "tokens_per_second": 15000.0,
        "train_loss_first": LOSSES[0],
        "train_loss_last": LOSSES[-1],
        "global_step": 80,
    }
    (out / STATE_FILE).write_text(
        json.dumps(
            {
                "format_version": 1,
                "plan": plan.to_dict(),
                "status": "completed",
                "started_at": "t0",
                "finished_at": "t1",
                "error": None,
                "progress": {"global_step": 80, "max_steps": 80, "samples_seen": 1280},
                "results": results,
            }
        )
    )
    lines = [{"event": "train", "step": 10 * i + 1, "loss": v, "tokens_per_second": 14000.0 + 200 * i} for i, v in enumerate(LOSSES)]
    lines.insert(5, {"event": "eval", "step": 40, "eval_loss": 1.9})
    (out / METRICS_FILE).write_text("\n".join(map(json.dumps, lines)) + '\n{"event": "tra')  # killed mid-line
    return out


def test_show_adds_a_sparkline_of_the_logged_loss(tmp_path):
    out = _run_dir(tmp_path)
    m = read_metrics(out)
    assert m.loss == LOSSES and m.eval_steps == [40] and m.eval_loss == [1.9]
    r = gpuplan("show", out)
    assert r.returncode == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if line.startswith("  loss ") and "logged steps" in line)
    assert line == f"  loss {sparkline(LOSSES)} 1.2000..5.6000 over 8 logged steps"
    assert sparkline(LOSSES)[0] == "█" and sparkline(LOSSES)[-1] == "▁"


def test_show_lists_the_memory_parts_in_the_plans_order(tmp_path, capsys):
    """The state file is written with sorted keys (lifecycle/state.py); show lists the memory parts
    as plan does (weights, gradients, optimizer states, ...), not alphabetically."""
    from gpuplan.cli.main import main
    from gpuplan.lifecycle.state import RunState
    from gpuplan.render.text import render_plan

    plan = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu"))
    out = tmp_path / "run"
    out.mkdir()
    RunState(plan, str(out))  # what apply writes first

    def parts(text: str) -> list[str]:
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("Memory "))
        return [line.split()[0] for line in lines[start + 1 :][:7]]

    assert main(["show", str(out)]) == 0
    shown = parts(capsys.readouterr().out)
    assert shown == parts(render_plan(plan.to_dict()))
    assert shown == ["weights", "gradients", "optimizer_states", "activations", "logits_loss", "temporaries", "overhead"]


def test_show_plot_writes_a_png_with_four_panels(tmp_path):
    out = _run_dir(tmp_path)
    png = tmp_path / "run.png"
    r = gpuplan("show", out, "--plot", png)
    assert r.returncode == 0, r.stderr
    assert f"Drew {out} to {png}" in r.stderr
    import matplotlib.image

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    umask = os.umask(0)
    os.umask(umask)
    assert png.stat().st_mode & 0o777 == 0o666 & ~umask  # as any file the user writes, not mkstemp's 0600
    assert matplotlib.image.imread(png).shape[:2] == (750, 1100)  # 11 x 7.5 in at 100 dpi

    from gpuplan.render.plot import draw_run

    fig = draw_run(json.loads((out / STATE_FILE).read_text()), read_metrics(out), "t")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Loss", "Throughput", "Peak memory", "Throughput, whole run"]
    loss_ax = fig.axes[0]
    assert [list(line.get_ydata()) for line in loss_ax.get_lines()] == [LOSSES, [1.9]]


def test_plot_refuses_a_saved_plan_and_names_the_fix(tmp_path):
    plan_json = tmp_path / "p.json"
    plan_json.write_text(json.dumps(plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu")).to_dict()))
    r = gpuplan("show", plan_json, "--plot", tmp_path / "x.png")
    assert r.returncode == 1 and "--plot draws a run: give its output dir" in r.stderr
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_is_a_clear_error(tmp_path):
    out = _run_dir(tmp_path)
    hide = tmp_path / "no-matplotlib" / "matplotlib"
    hide.mkdir(parents=True)  # a package that fails to import, first on the path: as if not installed
    (hide / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    from tests.helpers.cli_runs import REPO

    r = gpuplan("show", out, "--plot", tmp_path / "x.png", PYTHONPATH=f"{hide.parent}:{REPO}")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--plot needs matplotlib, which is not installed: pip install 'gpuplan[plot]'" in r.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("name", ["x.jpg", "x"])
def test_plot_wants_a_png_name(tmp_path, name):
    r = gpuplan("show", _run_dir(tmp_path), "--plot", tmp_path / name)
    assert r.returncode == 1 and "name the file FILE.png" in r.stderr
