"""A CPU plan speaks of the CPU: no CUDA counters, no "GPU(s)", no "on cpu" (issue 15, item 4)."""

import pytest

from gpuplan.plan.sections import HardwareSection, MemorySection
from gpuplan.render.text import render_memory, render_plan, summary_line
from tests.cli.test_render_text import PLAN
from tests.helpers.planning import plan_text, spec

CPU = {"name": "cpu", "vendor": "cpu", "count": 1, "nodes": 1}


def test_cpu_memory_table_names_the_cpu_and_no_cuda_counter():
    lines = render_memory(MemorySection.from_dict(PLAN["memory"]), HardwareSection.from_dict(CPU))
    assert lines[0] == "Memory per training process (analytic estimate) on the CPU with 80.0 GiB of RAM:"
    assert "  allocated peak       10.0 GiB   tensors alive at the peak" in lines
    assert lines[-1].startswith("  process total        12.0 GiB   tensors + allocator")
    assert not any("cuda" in line or "nvidia-smi" in line for line in lines)


def test_gpu_memory_table_keeps_the_cuda_counter():
    lines = render_memory(MemorySection.from_dict(PLAN["memory"]), HardwareSection.from_dict(PLAN["hardware"]))
    assert "  allocated peak       10.0 GiB   torch.cuda.max_memory_allocated" in lines


@pytest.mark.parametrize("count, word", [(1, "1 CPU process"), (2, "2 CPU processes")])
def test_cpu_summary_and_head_count_processes(count, word):
    data = {**PLAN, "hardware": {**CPU, "count": count}}
    assert summary_line(data) == f"Plan: 1 to add, 1 to change. batch 384 = 64 x 6 x {word}; 12.0 GiB of 80.0 GiB"
    assert render_plan(data).splitlines()[1] == f"  llama (162.0M parameters, causal-lm) on the CPU ({word})"


def test_a_real_cpu_plan_has_no_gpu_words(tmp_path):
    text = render_plan(
        plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 128", training="effective_batch_size = 16")).to_dict()
    )
    assert "torch.cuda" not in text and "GPU(s)" not in text and " on cpu" not in text
    assert "the CPU has no TF32" in text and "x 1 CPU process;" in text


def test_cpu_split_errors_count_processes(tmp_path):
    from gpuplan.plan.types import PlanError

    with pytest.raises(PlanError, match="does not split over 2 CPU processes"):
        plan_text(
            tmp_path,
            spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 128", training="effective_batch_size = 15").replace(
                'gpu = "cpu"', 'gpu = "cpu"\ncount = 2'
            ),
        )
