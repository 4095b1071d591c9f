"""model.dtype = "float16" under LoRA / QLoRA: a frozen fp16 base with fp32 adapters is planned (T4 / V100);
only what would train in fp16 (full fine-tuning, modules_to_save copies) is refused, with that reason."""

from __future__ import annotations

import re

import pytest

from gpuplan.plan.types import PlanError
from tests.helpers.planning import plan_text, spec


def _plan(tmp_path, method, gpu, tail=""):
    return plan_text(
        tmp_path,
        spec(
            "llama-3.1-8b", gpu, extra=f'method = "{method}"\ndtype = "float16"', data="seq_len = 1024", training="effective_batch_size = 8"
        )
        + tail,
    )


def test_fp16_base_lora_is_planned_on_a_v100(tmp_path):
    plan = _plan(tmp_path, "lora", "V100-32GB")
    assert plan.value("model.dtype") == "float16"
    assert plan.value("training.fp16") is True and plan.value("training.bf16") is False
    assert "adapters' fp32 gradients" in plan.settings["training.fp16"].reason
    assert not [d for d in plan.diagnostics if d.key == "model.dtype" and d.severity == "error"]


def test_fp16_base_qlora_is_planned_on_a_t4(tmp_path):
    plan = _plan(tmp_path, "qlora", "T4")
    assert plan.value("training.fp16") is True


def test_fp16_base_on_a_bf16_gpu_runs_fp16_autocast(tmp_path):
    plan = _plan(tmp_path, "lora", "A100-80GB")
    assert (plan.value("training.fp16"), plan.value("training.bf16")) == (True, False)
    assert "not bf16" in plan.settings["training.bf16"].reason


def test_fp16_modules_to_save_copies_are_refused_with_their_reason(tmp_path):
    with pytest.raises(PlanError) as e:
        _plan(tmp_path, "lora", "V100-32GB", '\n[lora]\nmodules_to_save = ["lm_head"]\n')
    d = next(d for d in e.value.diagnostics if d.key == "model.dtype")
    assert "fp16 copies of lm_head" in d.summary and "fp32 adapters" in d.summary
    assert 'model.method = "qlora"' in d.fix


def test_fp16_full_fine_tuning_stays_refused(tmp_path):
    with pytest.raises(PlanError, match="pure fp16 full fine-tuning is refused"):
        _plan(tmp_path, "full", "A100-80GB")


def test_peft_keeps_adapters_fp32_and_modules_to_save_fp16_over_an_fp16_base():
    """The premise of the rule, read from the installed peft on a real (tiny) fp16 model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=64
    )
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float16)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    trained = {n: p.dtype for n, p in peft.named_parameters() if p.requires_grad}
    assert {d for n, d in trained.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in trained.items() if "modules_to_save" in n} == {torch.float16}


@pytest.mark.slow
def test_lora_over_an_fp16_base_applies_with_fp32_adapters(tmp_path):
    """apply loads the base in fp16 and trains the adapters in fp32 (on CPU without autocast: no GradScaler)."""
    import os

    from safetensors.torch import load_file

    from gpuplan.apply.train.execute import execute
    from tests.helpers.apply_plans import cpu_plan, read_jsonl
    from tests.helpers.lora_base import finetune_overrides, other_text, pretrain_base

    base_dir = pretrain_base(tmp_path)
    plan = cpu_plan(
        tmp_path,
        **finetune_overrides(
            base_dir, other_text(tmp_path / "other.txt"), "lora", **{"model.dtype": "float16", "output.dir": str(tmp_path / "ft")}
        ),
    )
    results = execute(plan, echo=lambda s: None, progress=False)
    losses = [r["loss"] for r in read_jsonl(os.path.join(plan.value("output.dir"), "metrics.jsonl")) if r["event"] == "train"]
    assert all(v == v for v in losses) and losses[-1] < losses[0], losses  # finite, and it learns
    adapter = load_file(os.path.join(results["final_model_dir"], "adapter_model.safetensors"))
    assert adapter and {str(t.dtype) for t in adapter.values()} == {"torch.float32"}


@pytest.mark.parametrize("method", ["lora", "qlora", "full"])
def test_the_no_bf16_warning_names_a_dtype_that_followed_plans_cleanly_and_no_larger(tmp_path, method):
    """model.dtype = "bfloat16" on a V100: the fix names float16 for an adapter base (float32 would
    double a LoRA base's weights) and float32 for full fine-tuning; followed, the warning is gone,
    the plan still fits, and a LoRA base takes no more memory than fp32's."""

    def plan(dtype, tmp, gpu="V100-32GB"):
        tmp.mkdir()
        count = "\ncount = 8" if method == "full" else ""
        text = spec("llama-3.1-8b", gpu, extra=f'method = "{method}"\ndtype = "{dtype}"', data="seq_len = 512")
        return plan_text(tmp, text.replace(f'gpu = "{gpu}"', f'gpu = "{gpu}"{count}'))

    warned = plan("bfloat16", tmp_path / "bf16")
    (w,) = [d for d in warned.diagnostics if d.key == "model.dtype" and d.severity == "warning"]
    (dtype,) = re.findall(r'model.dtype = "(\w+)"', w.fix.split(":")[0])
    assert dtype == ("float32" if method == "full" else "float16")
    followed = plan(dtype, tmp_path / "followed")
    assert followed.memory.fits and not [d for d in followed.diagnostics if d.key == "model.dtype"]
    if method == "lora":  # the fp32 base the old fix named does not fit a V100-32GB: its weights on an 80 GB card
        fp32 = plan("float32", tmp_path / "fp32", gpu="A100-80GB")
        assert followed.memory.components["weights"] < fp32.memory.components["weights"] / 1.9
