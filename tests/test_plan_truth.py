"""Issue 11: every statement a plan makes is true. One regression test per reviewed item."""

from __future__ import annotations

import pytest

from gpuplan.plan.types import PlanError
from plan_arguments import build_here
from planning import ENV, plan_text, spec


def change(plan, key):
    return next((c for c in plan.changes if c.key == key), None)


def errors_of(tmp_path, text, **kw):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text, **kw)
    return [d for d in e.value.diagnostics if d.severity == "error"]


# ---- plans that succeed and then fail at apply -------------------------------------
def test_hybrid_shard_is_refused_at_plan_time(tmp_path):  # item 3
    text = spec(extra="[distributed]\nstrategy = \"fsdp\"\nfsdp_sharding = \"hybrid_shard\"\n").replace(
        'gpu = "A100-80GB"', 'gpu = "A100-80GB"\ncount = 8\nnodes = 2')
    errs = errors_of(tmp_path, text)
    assert [e.key for e in errs] == ["distributed.fsdp_sharding"]
    assert "FSDP1" in errs[0].summary and '"full_shard"' in errs[0].fix


@pytest.mark.parametrize("backend", ["ts", "openxla", "aot_ts", "aot_eager_default_partitioner", "aot_eager_decomp_partition"])
def test_compile_backends_accelerate_rejects_are_refused(tmp_path, backend):  # item 4
    errs = errors_of(tmp_path, spec(training=f'torch_compile = true\ntorch_compile_backend = "{backend}"'))
    assert errs[0].key == "training.torch_compile_backend"


def test_a_backend_that_needs_a_package_is_checked(tmp_path):  # item 4
    local = spec(gpu="cpu", model="tiny-llama-cpu", training='torch_compile_backend = "tvm"')
    errs = errors_of(tmp_path, local)
    assert errs[0].key == "training.torch_compile_backend" and "tvm package" in errs[0].summary
    remote = plan_text(tmp_path, spec(training='torch_compile_backend = "tvm"'))  # an A100 elsewhere
    notes = [d for d in remote.diagnostics if d.key == "training.torch_compile_backend"]
    assert notes and "pip install tvm" in notes[0].fix


@pytest.mark.parametrize("scheduler", ["reduce_lr_on_plateau", "greedy"])
def test_eval_schedulers_need_eval_data(tmp_path, scheduler):  # item 5
    errs = errors_of(tmp_path, spec(training=f'lr_scheduler_type = "{scheduler}"'))
    assert errs[0].key == "training.lr_scheduler_type" and "eval" in errs[0].summary
    plan = plan_text(tmp_path, spec(training=f'lr_scheduler_type = "{scheduler}"',
                                    data='seq_len = 512\neval_fraction = 0.1\ntrain_files = ["a.txt"]'))
    build_here(plan)  # and what the plan accepts, TrainingArguments accepts


def test_compile_mode_needs_inductor(tmp_path):  # item 10
    errs = errors_of(tmp_path, spec(training='torch_compile_backend = "aot_eager"\ntorch_compile_mode = "max-autotune"'))
    assert errs[0].key == "training.torch_compile_mode" and "inductor" in errs[0].summary
    plan = plan_text(tmp_path, spec(training='torch_compile_mode = "max-autotune"'))
    assert plan.value("training.torch_compile_backend") == "inductor"
    assert build_here(plan)["dynamo"].mode == "max-autotune"
