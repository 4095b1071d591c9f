"""Golden lines: the text renderer draws from a plan dict built by hand."""

from gpuplan.plan.sections import HardwareSection, MemorySection
from gpuplan.render.style import Style
from gpuplan.render.text import render_changes, render_memory, render_plan, summary_line

GIB = 1024**3
PLAN = {
    "spec_path": "specs/x.toml",
    "hardware": {"name": "A100-80GB", "vendor": "nvidia", "count": 1, "nodes": 1},
    "model": {"model_type": "llama", "n_params": 162_000_000, "task": "causal-lm"},
    "settings": {
        "training.effective_batch_size": {"value": 384},
        "training.per_device_train_batch_size": {"value": 64},
        "training.gradient_accumulation_steps": {"value": 6},
    },
    "changes": [
        {
            "action": "change",
            "key": "training.per_device_train_batch_size",
            "before": 48,
            "after": 64,
            "rule": "batch.tensor_core_multiple",
            "reason": "multiples of 64",
        },
        {
            "action": "add",
            "key": "training.optim",
            "before": "auto",
            "after": "adamw_torch_fused",
            "rule": "optimizer.select",
            "reason": "fused",
        },
    ],
    "diagnostics": [{"severity": "note", "key": None, "summary": "hello", "detail": None, "fix": "do x"}],
    "memory": {
        "allocated_peak_bytes": 10 * GIB,
        "reserved_peak_bytes": 12 * GIB,
        "capacity_bytes": 80 * GIB,
        "usable_bytes": int(73.6 * GIB),
        "headroom": 0.08,
        "fits": True,
        "method": "analytic",
        "components": {"weights": 4 * GIB, "overhead": 2 * GIB},
        "savers": [],
        "notes": [],
    },
    "throughput": {},
}


def test_change_lines():
    lines = render_changes(PLAN["changes"])
    assert lines == [
        "  ~ training.per_device_train_batch_size = 48 -> 64",
        "      multiples of 64 [batch.tensor_core_multiple]",
        '  + training.optim = "adamw_torch_fused"',
        "      fused [optimizer.select]",
    ]


def test_memory_table():
    lines = render_memory(MemorySection.from_dict(PLAN["memory"]), HardwareSection.from_dict(PLAN["hardware"]))
    assert lines[0] == "Memory per GPU (analytic estimate) on A100-80GB with 80.0 GiB:"
    assert "  weights               4.0 GiB" in lines
    assert lines[-1] == "  device total         12.0 GiB   nvidia-smi; fits in 73.6 GiB usable (8% headroom)"


def test_summary_and_whole_plan():
    assert summary_line(PLAN) == "Plan: 1 to add, 1 to change. batch 384 = 64 x 6 x 1 GPU(s); 12.0 GiB of 80.0 GiB"
    text = render_plan(PLAN)
    assert text.splitlines()[1] == "  llama (162.0M parameters, causal-lm) on 1 x A100-80GB"
    assert "Note: hello\n  fix: do x" in text


def test_colour_only_when_enabled():
    coloured = render_changes(PLAN["changes"], Style(True))
    assert "\033[33m" in coloured[0]  # yellow ~
    assert "\033[32m" in coloured[2]  # green +


def test_throughput_prints_the_step_time_by_term_and_what_bounds_it():
    from gpuplan.plan.sections import ThroughputSection
    from gpuplan.render.text import render_throughput

    t = ThroughputSection.from_dict(
        {
            "tokens_per_step": 4096,
            "step_time_s": 2.0,
            "tokens_per_second": 2048.0,
            "max_steps": 10,
            "run_time_s": 20.0,
            "assumption": "step-time model, ampere-dc constants (fitted)",
            "step_time": {"summary": "matmuls 58%, memory-bound 21%, optimizer 9%, fixed costs 12%", "bound_by": "matmuls"},
        }
    )
    assert render_throughput(t) == [
        "Throughput: 4,096 tokens/step, ~2.00 s/step, ~2,048 tokens/s, ~20 s for 10 steps",
        "  step time by term: matmuls 58%, memory-bound 21%, optimizer 9%, fixed costs 12%; bound by matmuls",
        "  assumption: step-time model, ampere-dc constants (fitted)",
    ]
