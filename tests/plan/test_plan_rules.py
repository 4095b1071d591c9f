"""One test per rule of docs/design.md "Rules the planner must own", on real specs and model configs."""

import pytest

from gpuplan.plan.types import PlanError
from tests.helpers.planning import ENV_NO_BNB, plan_text, spec


def change(plan, key):
    return next((c for c in plan.changes if c.key == key), None)


def errors_of(tmp_path, text, **kw):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text, **kw)
    return [d for d in e.value.diagnostics if d.severity == "error"]


# ---- batch ---------------------------------------------------------------------------
A100_FP16 = "fp16 = true\nbf16 = false\nper_device_train_batch_size = 36\neffective_batch_size = 360"


def test_a100_fp16_moves_batch_so_tokens_per_micro_batch_are_a_multiple_of_64(tmp_path):
    plan = plan_text(tmp_path, spec(training=A100_FP16, data="seq_len = 1000"))
    c = change(plan, "training.per_device_train_batch_size")
    assert (c.action, c.before, c.after, c.rule) == ("change", 36, 40, "batch.tensor_core_multiple")
    assert "multiples of 64" in c.reason and "36 x 1000 = 36,000 is not a multiple of 64" in c.reason
    a = change(plan, "training.gradient_accumulation_steps")
    assert (a.after, a.rule) == (9, "batch.split")
    assert "360 = 40 per device x 9" in a.reason
    assert plan.value("training.effective_batch_size") == 360
    assert plan.settings["training.per_device_train_batch_size"].source == "adjusted"


def test_a_batch_whose_tokens_are_already_a_multiple_is_kept(tmp_path):
    # issue 11 item 12: 48 x 512 is a multiple of 64; the plan used to move 48 to 64
    plan = plan_text(tmp_path, spec(training=A100_FP16.replace("36", "48").replace("360", "384")))
    assert plan.value("training.per_device_train_batch_size") == 48
    assert change(plan, "training.per_device_train_batch_size") is None
    plan_text(tmp_path, spec(training=A100_FP16.replace("36", "48").replace("360", "384")), strict=True)
    # the guide's fp16-8 versus A100-64: 36 x 1000 = 36,000 is a multiple of 8, so an H100 keeps 36
    h100 = plan_text(tmp_path, spec(gpu="H100-80GB", training=A100_FP16, data="seq_len = 1000"))
    assert h100.value("training.per_device_train_batch_size") == 36


def test_strict_refuses_the_same_adjustment(tmp_path):
    errs = errors_of(tmp_path, spec(training=A100_FP16, data="seq_len = 1000"), strict=True)
    assert len(errs) == 1
    assert errs[0].key == "training.per_device_train_batch_size"
    assert "(--strict)" in errs[0].summary and "36" in errs[0].summary and "40" in errs[0].summary


def test_tensor_core_multiple_is_8_off_a100_and_4_for_tf32(tmp_path):
    # an odd seq_len: batch x seq_len is a multiple of m only when the batch is
    plan = plan_text(
        tmp_path,
        spec(gpu="H100-80GB", data="seq_len = 1001", training="bf16 = true\nper_device_train_batch_size = 6\neffective_batch_size = 48"),
    )
    assert plan.value("training.per_device_train_batch_size") == 8
    plan = plan_text(
        tmp_path,
        spec(
            gpu="A10G",
            data="seq_len = 1001",
            training="bf16 = false\nfp16 = false\nper_device_train_batch_size = 5\neffective_batch_size = 40",
        ),
    )
    assert plan.value("training.tf32") is True
    assert plan.value("training.per_device_train_batch_size") == 4


def test_any_two_of_three_derive_the_third(tmp_path):
    plan = plan_text(tmp_path, spec(training="per_device_train_batch_size = 8\ngradient_accumulation_steps = 4"))
    assert plan.value("training.effective_batch_size") == 32
    assert plan.settings["training.effective_batch_size"].source == "derived"
    plan = plan_text(tmp_path, spec(training="effective_batch_size = 64\ngradient_accumulation_steps = 4"))
    assert plan.value("training.per_device_train_batch_size") == 16
    plan = plan_text(
        tmp_path, spec(training="effective_batch_size = 64\nper_device_train_batch_size = 16\ngradient_accumulation_steps = 4")
    )
    assert plan.changes == () or all(c.key != "training.per_device_train_batch_size" for c in plan.changes)


def test_values_that_do_not_divide_are_errors_with_nearest_fixes(tmp_path):
    (e,) = errors_of(
        tmp_path, spec(training="effective_batch_size = 100\nper_device_train_batch_size = 8\ngradient_accumulation_steps = 4")
    )
    assert "8 x 4 x 1 = 32" in e.summary
    assert e.fix == "set training.effective_batch_size = 32, or remove one of the three"
    (e,) = errors_of(tmp_path, spec(training="effective_batch_size = 100\ngradient_accumulation_steps = 3"))
    assert e.key == "training.gradient_accumulation_steps"
    assert "99 or 102" in e.fix
    (e,) = errors_of(
        tmp_path, spec(training="effective_batch_size = 100", extra="").replace('gpu = "A100-80GB"', 'gpu = "A100-80GB"\ncount = 8')
    )
    assert "does not split over 8" in e.summary and "96 or 104" in e.fix


def test_explicit_batch_without_effective_batch_is_kept(tmp_path):
    plan = plan_text(tmp_path, spec(training="fp16 = true\nbf16 = false\nper_device_train_batch_size = 48"))
    assert plan.value("training.per_device_train_batch_size") == 48
    assert plan.value("training.effective_batch_size") == 48


def test_accumulation_kept_small_largest_batch_that_fits(tmp_path):
    import dataclasses

    from gpuplan.modelinfo import model_facts, read_config
    from gpuplan.plan.estimate.memory.estimate import estimate_memory

    plan = plan_text(tmp_path, spec(training="bf16 = true\neffective_batch_size = 512"))
    b = plan.value("training.per_device_train_batch_size")
    a = plan.value("training.gradient_accumulation_steps")
    assert b * a == 512 and b % 64 == 0 and a > 1
    # the next larger split (2b) does not fit: b is the largest
    wl = plan.memory.workload
    facts = model_facts(read_config(plan.value("model.config")))
    bigger = estimate_memory(facts, dataclasses.replace(wl, per_device_batch=2 * b, gradient_accumulation_steps=a // 2))
    assert bigger.reserved_peak_bytes > plan.memory.usable_bytes >= plan.memory.reserved_peak_bytes


# ---- precision ------------------------------------------------------------------------
def test_bf16_on_v100_becomes_fp16_with_a_reason(tmp_path):
    plan = plan_text(tmp_path, spec(model="bert-large-uncased", gpu="V100-16GB", training="bf16 = true"))
    c = change(plan, "training.bf16")
    assert (c.action, c.before, c.after, c.rule) == ("change", True, False, "precision.mixed")
    assert "V100-16GB has no bf16" in c.reason
    assert plan.value("training.fp16") is True
    assert "fp16" in change(plan, "training.fp16").reason


def test_bf16_on_v100_is_an_error_under_strict(tmp_path):
    errs = errors_of(tmp_path, spec(model="bert-large-uncased", gpu="V100-16GB", training="bf16 = true"), strict=True)
    assert errs[0].key == "training.bf16"


def test_fp16_and_bf16_both_true_is_an_error_naming_both(tmp_path):
    (e,) = errors_of(tmp_path, spec(training="fp16 = true\nbf16 = true"))
    assert "training.fp16" in e.summary and "training.bf16" in e.summary


def test_auto_precision_by_generation(tmp_path):
    a100 = plan_text(tmp_path, spec())
    assert (a100.value("training.bf16"), a100.value("training.fp16"), a100.value("training.tf32")) == (True, False, True)
    t4 = plan_text(tmp_path, spec(gpu="T4", data="seq_len = 128", training="effective_batch_size = 8"))
    assert (t4.value("training.bf16"), t4.value("training.fp16"), t4.value("training.tf32")) == (False, True, False)
    cpu = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 64"))
    assert (cpu.value("training.bf16"), cpu.value("training.fp16"), cpu.value("training.tf32")) == (False, False, False)


def test_tf32_on_pre_ampere_is_adjusted(tmp_path):
    plan = plan_text(tmp_path, spec(gpu="V100-32GB", training="tf32 = true"))
    c = change(plan, "training.tf32")
    assert c.after is False and "compute capability >= 8.0" in c.reason


def test_pure_fp16_weights_are_refused(tmp_path):
    errs = errors_of(tmp_path, spec(extra='dtype = "float16"'))
    assert errs[0].key == "model.dtype"


def test_fp16_on_cpu_is_resolved_at_plan_time(tmp_path):
    plan = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 64", training="fp16 = true"))
    assert plan.value("training.fp16") is False
    assert "CPU" in change(plan, "training.fp16").reason


# ---- optimizer ------------------------------------------------------------------------
def test_optimizer_auto_is_fused_adamw_on_cuda_and_cpu(tmp_path):
    assert plan_text(tmp_path, spec()).value("training.optim") == "adamw_torch_fused"
    cpu = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 64"))
    assert cpu.value("training.optim") == "adamw_torch_fused"


def test_removed_optimizer_is_resolved_with_a_reason(tmp_path):
    plan = plan_text(tmp_path, spec(training='optim = "adamw_apex_fused"'))
    c = change(plan, "training.optim")
    assert c.after == "adamw_torch_fused" and "no longer in transformers 5" in c.reason


def test_bnb_optimizer_without_bitsandbytes_is_resolved(tmp_path):
    # planned for this machine (gpu = "auto", detected here): what is installed here decides
    from gpuplan.hardware.catalog import lookup

    here = spec(gpu="auto", training='optim = "adamw_bnb_8bit"')
    plan = plan_text(tmp_path, here, env=ENV_NO_BNB, detect=lambda: lookup("A100-80GB"))
    c = change(plan, "training.optim")
    assert c.after == "adamw_torch_fused" and "bitsandbytes" in c.reason
    # planned for an A100 elsewhere: kept, and the plan says what to install there (issue 11 item 16)
    remote = plan_text(tmp_path, spec(training='optim = "adamw_bnb_8bit"'), env=ENV_NO_BNB)
    assert remote.value("training.optim") == "adamw_bnb_8bit"
    assert any("pip install bitsandbytes" in (d.fix or "") for d in remote.diagnostics)


def test_memory_pressure_picks_8bit_then_checkpointing(tmp_path):
    plan = plan_text(
        tmp_path,
        spec(model="phi-2", gpu="RTX-4090", extra='dtype = "bfloat16"', data="seq_len = 2048", training="effective_batch_size = 32"),
    )
    assert plan.value("training.optim") == "adamw_bnb_8bit"
    assert plan.value("training.gradient_checkpointing") is True
    names = [s.name for s in plan.memory.savers]
    # cheapest slowdown first: 8-bit states (none), the chunked loss (a few %), then checkpointing (20%)
    assert names == ["8-bit optimizer", "chunked cross-entropy", "gradient checkpointing"]
    assert all(s.saved_bytes > 0 for s in plan.memory.savers)
    assert "does not fit without it" in change(plan, "training.gradient_checkpointing").reason


def test_without_bitsandbytes_memory_pressure_goes_to_adafactor(tmp_path):
    plan = plan_text(
        tmp_path,
        spec(model="phi-2", gpu="RTX-4090", extra='dtype = "bfloat16"', data="seq_len = 2048", training="effective_batch_size = 32"),
        env=ENV_NO_BNB,
    )
    assert plan.value("training.optim") == "adafactor"


# ---- checkpointing / savers ------------------------------------------------------------
def test_checkpointing_auto_stays_off_when_it_fits(tmp_path):
    plan = plan_text(tmp_path, spec())
    assert plan.value("training.gradient_checkpointing") is False
    assert "fits without it" in change(plan, "training.gradient_checkpointing").reason
    assert plan.memory.savers == ()


def test_user_checkpointing_false_that_cannot_fit_names_the_key(tmp_path):
    errs = errors_of(
        tmp_path,
        spec(
            model="phi-2",
            gpu="RTX-4090",
            extra='dtype = "bfloat16"',
            data="seq_len = 2048",
            training='effective_batch_size = 32\ngradient_checkpointing = false\noptim = "adamw_torch_fused"',
        ),
    )
    assert "training.gradient_checkpointing, training.optim set by the spec" in errs[0].detail


def test_empty_cache_is_off_unless_near_the_limit_and_off_on_cpu(tmp_path):
    plan = plan_text(tmp_path, spec(training='torch_empty_cache_steps = "auto"'))
    assert plan.value("training.torch_empty_cache_steps") == 0
    cpu = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 64", training="torch_empty_cache_steps = 4"))
    assert cpu.value("training.torch_empty_cache_steps") == 0


def test_nothing_fits_gives_the_smallest_requirement(tmp_path):
    (e,) = errors_of(
        tmp_path,
        spec(
            model="mistral-7b-v0.3", gpu="RTX-4090", extra='dtype = "bfloat16"', data="seq_len = 2048", training="effective_batch_size = 32"
        ),
    )
    assert e.summary.startswith("does not fit: needs ")
    assert "at per-device batch 1 with every saver on" in e.summary
    assert "an RTX-4090 has 24 GiB" in e.summary


# ---- dataloader, compile, attention ------------------------------------------------------
def test_pin_memory_only_with_cuda_and_workers_from_cpu_count(tmp_path):
    plan = plan_text(tmp_path, spec().replace('gpu = "A100-80GB"', 'gpu = "A100-80GB"\ncount = 4\ncpu_count = 16'))
    assert plan.value("training.dataloader_pin_memory") is True
    assert plan.value("training.dataloader_num_workers") == 3  # min(2x4, 8, 16/4 - 1)
    cpu = plan_text(tmp_path, spec(model="tiny-llama-cpu", gpu="cpu", data="seq_len = 64", training="dataloader_pin_memory = true"))
    assert cpu.value("training.dataloader_pin_memory") is False
    assert cpu.value("training.dataloader_num_workers") == 0


def test_compile_backend_turns_compile_on_and_defaults_to_inductor(tmp_path):
    plan = plan_text(tmp_path, spec(training='torch_compile_backend = "aot_eager"'))
    assert plan.value("training.torch_compile") is True
    plan = plan_text(tmp_path, spec(training="torch_compile = true"))
    assert plan.value("training.torch_compile_backend") == "inductor"
    errs = errors_of(tmp_path, spec(training='torch_compile = false\ntorch_compile_backend = "inductor"'))
    assert errs[0].key == "training.torch_compile"


def test_flash_attention_needs_package_ampere_and_half_precision(tmp_path):
    from gpuplan.hardware.catalog import lookup

    plan = plan_text(
        tmp_path, spec(gpu="auto", extra='attn_implementation = "flash_attention_2"'), detect=lambda: lookup("V100-32GB")
    )  # this machine: its packages count
    c = change(plan, "model.attn_implementation")
    assert c.after == "sdpa" and "Ampere" in c.reason and "flash_attn" in c.reason
    remote = plan_text(tmp_path, spec(gpu="V100-32GB", extra='attn_implementation = "flash_attention_2"'))
    c = change(remote, "model.attn_implementation")  # another machine: only what the GPU decides
    assert c.after == "sdpa" and "Ampere" in c.reason and "flash_attn package" not in c.reason
    plan = plan_text(tmp_path, spec(extra='attn_implementation = "auto"'))
    assert plan.value("model.attn_implementation") == "sdpa"


# ---- data and schedule ------------------------------------------------------------------
def test_seq_len_beyond_learned_positions_is_an_error(tmp_path):
    errs = errors_of(tmp_path, spec(model="gpt2", data="seq_len = 2048"))
    assert errs[0].key == "data.seq_len" and "1024" in errs[0].fix


def test_warmup_ratio_becomes_steps_and_conflicts_with_steps(tmp_path):
    plan = plan_text(tmp_path, spec(training="max_steps = 1000\nwarmup_ratio = 0.03"))
    assert plan.value("training.warmup_steps") == 30
    errs = errors_of(tmp_path, spec(training="warmup_steps = 10\nwarmup_ratio = 0.03"))
    assert errs[0].key == "training.warmup_ratio"


def test_every_resolved_value_has_a_source_and_changes_have_reasons(tmp_path):
    plan = plan_text(tmp_path, spec(training="effective_batch_size = 64"))
    for key, s in plan.settings.items():
        assert s.source in ("user", "default", "derived", "adjusted"), key
        if s.source in ("derived", "adjusted"):
            assert s.reason and s.rule, key
    assert all(c.reason and c.rule for c in plan.changes)


def test_unknown_gpu_name_suggests(tmp_path):
    errs = errors_of(tmp_path, spec(gpu="A1000"))
    assert errs[0].key == "hardware.gpu" and "Did you mean" in errs[0].summary


def test_roberta_positions_exclude_the_padding_offset(tmp_path):
    errs = errors_of(tmp_path, spec(model="roberta-base", data="seq_len = 514", extra='task = "masked-lm"'))
    assert errs[0].key == "data.seq_len" and "512" in errs[0].fix
    assert plan_text(tmp_path, spec(model="roberta-base", data="seq_len = 512", extra='task = "masked-lm"'))
