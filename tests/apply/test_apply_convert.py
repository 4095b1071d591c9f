"""Plan -> TrainingArguments (convert.py) and the device check, without training."""

from __future__ import annotations

import re

import pytest
import torch

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.launch.device import check_device
from gpuplan.apply.train.arguments import torch_dtype, training_arguments, training_arguments_kwargs
from gpuplan.errors import GpuplanError
from tests.helpers.apply_plans import H100_PROFILE, cpu_plan
from tests.helpers.plan_arguments import build_here


def test_every_planned_value_reaches_training_arguments(tmp_path):
    plan = cpu_plan(
        tmp_path,
        **{
            "training.per_device_train_batch_size": 4,
            "training.per_device_eval_batch_size": 16,
            "training.gradient_accumulation_steps": 2,
            "training.gradient_checkpointing": True,
            "training.optim": "adafactor",
            "training.learning_rate": 1e-4,
            "training.weight_decay": 0.1,
            "training.max_grad_norm": 0.5,
            "training.lr_scheduler_type": "cosine",
            "training.warmup_steps": 3,
            "training.max_steps": 7,
            "training.seed": 11,
            "training.dataloader_num_workers": 2,
            "training.torch_empty_cache_steps": 5,
            "training.logging_steps": 2,
            "training.save_steps": 6,
            "training.save_total_limit": 2,
            "training.bf16": True,
        },
    )
    args = training_arguments(plan, progress=False)
    assert args.output_dir == plan.value("output.dir")
    assert args.use_cpu is True
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size) == (4, 16)
    assert args.gradient_accumulation_steps == 2
    assert args.activation_checkpointing is True  # transformers 5.24's name for gradient checkpointing
    assert args.optim.value == "adafactor"
    assert (args.learning_rate, args.weight_decay, args.max_grad_norm) == (1e-4, 0.1, 0.5)
    assert args.lr_scheduler_type.value == "cosine" and args.warmup_steps == 3
    assert (args.max_steps, args.seed) == (7, 11)
    assert args.dataloader_num_workers == 2 and args.dataloader_pin_memory is False
    assert args.torch_empty_cache_steps == 5
    assert (args.logging_steps, args.save_steps, args.save_total_limit) == (2, 6, 2)
    assert args.bf16 is True and args.fp16 is False and args.mixed_precision == "bf16"
    assert args.torch_compile is False and args.torch_compile_backend is None
    assert args.eval_strategy.value == "no" and args.report_to == [] and args.disable_tqdm is True


def test_off_values_map_to_what_transformers_expects(tmp_path):
    kw = training_arguments_kwargs(cpu_plan(tmp_path, **{"training.max_steps": None, "training.torch_empty_cache_steps": 0}))
    assert kw["max_steps"] == -1  # "use num_train_epochs"
    assert kw["torch_empty_cache_steps"] is None  # 0 would fail TrainingArguments validation
    # a backend alone turns compile on in TrainingArguments: it is passed only with compile on
    assert kw["torch_compile"] is False and kw["torch_compile_backend"] is None
    assert "gradient_checkpointing" not in kw and "warmup_ratio" not in kw


def test_compile_backend_and_eval_reach_arguments(tmp_path):
    plan = cpu_plan(
        tmp_path,
        **{
            "training.torch_compile": True,
            "training.torch_compile_backend": "aot_eager",
            "data.eval_fraction": 0.1,
            "training.eval_steps": 3,
        },
    )
    args = training_arguments(plan, progress=True)
    assert args.torch_compile is True and args.torch_compile_backend == "aot_eager"
    assert args.eval_strategy.value == "steps" and args.eval_steps == 3
    assert args.disable_tqdm is True  # on a terminal too: apply draws its own progress line (progress_line.py)


def test_gpu_plan_keeps_gpu_values(tmp_path):
    plan = cpu_plan(
        tmp_path,
        hardware=H100_PROFILE,
        **{"training.tf32": True, "training.fp16": True, "training.dataloader_pin_memory": True, "training.optim": "adamw_torch_fused"},
    )
    kw = training_arguments_kwargs(plan)
    assert kw["use_cpu"] is False and kw["tf32"] is True and kw["fp16"] is True
    assert kw["dataloader_pin_memory"] is True and kw["optim"] == "adamw_torch_fused"


@pytest.mark.parametrize("name,expected", [("float32", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")])
def test_torch_dtype(tmp_path, name, expected):
    import torch

    assert torch_dtype(cpu_plan(tmp_path, **{"model.dtype": name})) is getattr(torch, expected)


def test_unknown_dtype_is_refused_when_the_plan_is_built(tmp_path):
    """A plan with a dtype apply cannot load is refused before anything reads it (plan/resolved.py)."""
    with pytest.raises(GpuplanError, match=re.escape("model.dtype = 'int8' in the plan is not 'float32' | 'bfloat16' | 'float16'")) as e:
        cpu_plan(tmp_path, **{"model.dtype": "int8"})
    assert e.value.key == "model.dtype"


def test_the_planned_dtype_is_the_torch_dtype(tmp_path):
    assert torch_dtype(cpu_plan(tmp_path, **{"model.dtype": "bfloat16"})) is torch.bfloat16


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("training.dataloader_pin_memory", True, "pin_memory"),
        ("training.tf32", True, "tf32"),
        ("training.fp16", True, "fp16"),
        ("model.attn_implementation", "flash_attention_2", "flash_attention_2"),
    ],
)
def test_cpu_plan_with_values_the_cpu_cannot_honour_is_refused(tmp_path, key, value, words):
    with pytest.raises(ApplyError, match=f"cannot honour.*{words}.*gpuplan plan"):
        check_device(cpu_plan(tmp_path, **{key: value}))


def test_cpu_plan_passes(tmp_path):
    assert check_device(cpu_plan(tmp_path, **{"training.bf16": True})) == "cpu"


def test_gpu_plan_without_cuda_is_refused(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ApplyError, match="H100-80GB.*no CUDA device"):
        check_device(cpu_plan(tmp_path, hardware=H100_PROFILE))


def test_training_arguments_refusal_becomes_apply_error(tmp_path):
    plan = cpu_plan(tmp_path, **{"training.logging_steps": 0})
    with pytest.raises(ApplyError, match="refused by transformers.*logging_steps"):
        training_arguments(plan)


def test_warmup_ratio_becomes_a_fractional_warmup_steps(tmp_path):
    kw = training_arguments_kwargs(cpu_plan(tmp_path, **{"training.warmup_ratio": 0.1}))
    assert kw["warmup_steps"] == 0.1  # transformers 5.24 reads a float in [0, 1) as a ratio
    assert training_arguments(cpu_plan(tmp_path, **{"training.warmup_ratio": 0.1})).warmup_steps == 0.1
    with pytest.raises(GpuplanError, match="warmup_steps = 3 and training.warmup_ratio = 0.1 are both set") as e:
        cpu_plan(tmp_path, **{"training.warmup_ratio": 0.1, "training.warmup_steps": 3})  # refused when the plan is built
    assert e.value.key == "training.warmup_ratio"


def test_compile_mode_only_with_compile(tmp_path):
    on = {"training.torch_compile": True, "training.torch_compile_backend": "inductor", "training.torch_compile_mode": "reduce-overhead"}
    assert training_arguments_kwargs(cpu_plan(tmp_path, **on))["torch_compile_mode"] == "reduce-overhead"
    off = dict(on, **{"training.torch_compile": False})
    assert training_arguments_kwargs(cpu_plan(tmp_path, **off))["torch_compile_mode"] is None


@pytest.mark.parametrize("sharding,reshard", [("full_shard", True), ("shard_grad_op", False)])
def test_fsdp_strategy_maps_to_fsdp2_config(tmp_path, sharding, reshard):
    plan = cpu_plan(
        tmp_path,
        hardware=H100_PROFILE,
        **{"distributed.strategy": "fsdp", "distributed.fsdp_sharding": sharding, "distributed.fsdp_cpu_offload": True},
    )
    kw = training_arguments_kwargs(plan)
    assert kw["fsdp"] is True
    assert kw["fsdp_config"] == {"version": 2, "reshard_after_forward": reshard, "cpu_offload": True}


def test_deepspeed_strategy_maps_to_a_zero_config(tmp_path):
    plan = cpu_plan(
        tmp_path,
        hardware=H100_PROFILE,
        **{"distributed.strategy": "deepspeed", "distributed.zero_stage": 3, "distributed.offload_optimizer": True},
    )
    ds = training_arguments_kwargs(plan)["deepspeed"]
    assert ds["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    assert ds["train_micro_batch_size_per_gpu"] == "auto"
    with pytest.raises(ApplyError, match="zero_stage = 'auto'"):
        training_arguments_kwargs(cpu_plan(tmp_path, hardware=H100_PROFILE, **{"distributed.strategy": "deepspeed"}))


def test_single_process_strategies_add_nothing(tmp_path):
    for strategy in ("none", "ddp"):
        kw = training_arguments_kwargs(cpu_plan(tmp_path, **{"distributed.strategy": strategy}))
        assert "fsdp" not in kw and "deepspeed" not in kw


def test_an_unresolved_strategy_is_refused_when_the_plan_is_built(tmp_path):
    with pytest.raises(GpuplanError, match="distributed.strategy = 'auto' in the plan is not") as e:
        cpu_plan(tmp_path, **{"distributed.strategy": "auto"})
    assert e.value.key == "distributed.strategy"


def test_cpu_plan_with_deepspeed_is_refused_and_fsdp_is_not(tmp_path):
    with pytest.raises(ApplyError, match="distributed.strategy = 'deepspeed'"):
        check_device(cpu_plan(tmp_path, **{"distributed.strategy": "deepspeed"}))
    assert check_device(cpu_plan(tmp_path, **{"distributed.strategy": "fsdp"})) == "cpu"  # FSDP2 over gloo


def test_warmup_ratio_with_max_steps_applies_as_the_planned_steps(tmp_path):
    """Issue 11 item 1: the plan derives warmup_steps from warmup_ratio x max_steps; apply
    used to report its own derived value as a user conflict (specs/llama-8b-2nodes.toml)."""
    from tests.helpers.planning import SPECS, plan_text, spec

    plan = plan_text(tmp_path, spec(training="max_steps = 1000\nwarmup_ratio = 0.03"))
    assert plan.settings["training.warmup_steps"].source == "derived"
    assert build_here(plan)["args"].warmup_steps == 30
    from gpuplan.plan.build import plan_file
    from tests.helpers.planning import ENV

    shipped = plan_file(SPECS / "llama-8b-2nodes.toml", environment=ENV)
    assert build_here(shipped)["args"].warmup_steps == 30
