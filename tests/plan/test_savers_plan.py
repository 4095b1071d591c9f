"""Liger kernels (memory/liger.py, rules/liger.py) and paged optimizers (memory/paging.py) in the
plan: where Liger runs and where it is refused, what its fused loss leaves of the peak, the
package on the target; what paging says it does and does not save."""

from __future__ import annotations

import pytest

from gpuplan.plan.estimate.memory.liger import AMD_GFX, FAMILIES, LIGER_GFX, flce_bytes, flce_chunk
from gpuplan.plan.types import PlanError
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.planning import ENV, SPECS, plan_text, spec

QLORA_8K = (SPECS / "llama-8b-qlora-4090-8k.toml").read_text().replace('"models/', f'"{SPECS}/models/').replace('"data/', f'"{SPECS}/data/')


def _qlora(tmp_path, gpu="RTX-4090", extra=""):
    return plan_text(
        tmp_path, QLORA_8K.replace('gpu = "RTX-4090"', f'gpu = "{gpu}"').replace("warmup_ratio = 0.03", "warmup_ratio = 0.03\n" + extra)
    )


def test_liger_families_are_ones_the_installed_liger_patches():
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    assert FAMILIES <= set(MODEL_TYPE_TO_APPLY_LIGER_FN)
    assert not {"gpt2", "gpt_neox", "opt", "phi", "bert"} & set(MODEL_TYPE_TO_APPLY_LIGER_FN)


def test_liger_amd_architectures_are_the_ones_its_utils_map():
    from liger_kernel.utils import _AMD_ARCH_BY_GFX

    assert LIGER_GFX == set(_AMD_ARCH_BY_GFX)
    assert set(AMD_GFX.values()) <= LIGER_GFX


def test_liger_chunk_follows_its_source():
    assert flce_chunk(4096 * 4, 4096, 32000) == 2048  # the worked example in fused_linear_cross_entropy.py
    assert flce_chunk(8192, 4096, 128256) == 256
    assert flce_chunk(100, 4096, 2048) == 100  # one chunk covers every token
    fwd, bwd = flce_bytes(8192, 4096, 128256, 2, 0)
    assert bwd == 8192 * 4096 * 2 + 4 * 8192 and fwd == bwd + 256 * 128256 * 2


def test_liger_on_the_4090_holds_no_logits_and_says_what_it_saves(tmp_path):
    plan = _qlora(tmp_path, extra="use_liger_kernel = true")
    assert plan.value("training.use_liger_kernel") is True and plan.memory.fits
    assert plan.value("training.loss_chunk_size") == 0
    assert "Liger's fused linear cross-entropy" in plan.settings["training.loss_chunk_size"].reason
    note = next(d for d in plan.diagnostics if d.key == "training.use_liger_kernel")
    assert "never holds the [8,192 x 128,256] logits" in note.summary and "lower" in note.summary
    assert any("Liger kernels: the step time does not count" in n for n in plan.throughput.notes)


@pytest.mark.parametrize("gpu, why", [("cpu", "do not run on a CPU")])
def test_liger_is_refused_where_it_cannot_run(tmp_path, gpu, why):
    with pytest.raises(PlanError) as e:
        _qlora(tmp_path, gpu=gpu, extra="use_liger_kernel = true")
    err = next(d for d in e.value.diagnostics if d.key == "training.use_liger_kernel")
    assert why in err.summary and err.fix == "set training.use_liger_kernel = false (or remove it)"


def test_liger_is_refused_for_a_family_it_does_not_patch(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, spec(model="gpt2", training="use_liger_kernel = true"))
    err = next(d for d in e.value.diagnostics if d.key == "training.use_liger_kernel")
    assert "does not patch model_type 'gpt2'" in err.summary


def test_liger_runs_on_the_amd_architectures_it_supports(tmp_path):
    plan = _qlora(tmp_path, gpu="MI300X", extra="use_liger_kernel = true")
    assert plan.value("training.use_liger_kernel") is True


def test_liger_with_a_chunk_size_is_refused(tmp_path):
    with pytest.raises(PlanError) as e:
        _qlora(tmp_path, extra="use_liger_kernel = true\nloss_chunk_size = 512")
    assert any("replaces the loss" in d.summary for d in e.value.diagnostics)


def test_apply_checks_the_liger_package_on_the_target(tmp_path):
    from gpuplan.apply.launch.packages import PIP_NAMES, needed_packages

    plan = cpu_plan(tmp_path, **{"training.use_liger_kernel": True})
    assert ("training.use_liger_kernel", "liger_kernel") in needed_packages(plan)
    assert PIP_NAMES["liger_kernel"] == "liger-kernel"


def test_paged_optimizer_says_what_paging_does_and_does_not_save(tmp_path):
    plan = _qlora(tmp_path, extra='optim = "paged_adamw_8bit"')
    note = next(d for d in plan.diagnostics if d.key == "training.optim")
    assert "CUDA unified memory" in note.summary and "can borrow at most" in note.summary
    assert "weights, gradients, activations and the logits are not paged" in note.summary
    assert "32 GB/s host link" in note.summary  # the RTX-4090's PCIe 4.0 x16 in the catalog


def test_paged_optimizer_on_cpu_says_it_saves_nothing(tmp_path):
    plan = plan_text(tmp_path, spec(model="llama-160m", gpu="cpu", training='optim = "paged_adamw_32bit"'), env=ENV)
    note = next(d for d in plan.diagnostics if d.key == "training.optim")
    assert "paging saves nothing" in note.summary


def test_apply_passes_liger_to_the_trainer_arguments(tmp_path):
    from gpuplan.apply.train.arguments import training_arguments_kwargs

    assert training_arguments_kwargs(cpu_plan(tmp_path, **{"training.use_liger_kernel": True}))["use_liger_kernel"] is True
    assert training_arguments_kwargs(cpu_plan(tmp_path))["use_liger_kernel"] is False
