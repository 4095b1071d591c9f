"""Issue 11: every statement a plan makes is true. One regression test per reviewed item."""

from __future__ import annotations

import pytest

from gpuplan.plan.types import PlanError
from tests.helpers.plan_arguments import build_here, build_with_scheduler, saved
from tests.helpers.planning import ENV, MODELS, spec
from tests.helpers.planning import plan_text as _plan_text
from tests.helpers.reason_oracle import check_reasons


def plan_text(tmp_path, text, **kw):
    """Every plan of the review is also held to both guards: its reasons, and apply's arguments."""
    plan = _plan_text(tmp_path, text, **kw)
    check_reasons(plan)
    build_with_scheduler(saved(plan))
    return plan


def change(plan, key):
    return next((c for c in plan.changes if c.key == key), None)


def errors_of(tmp_path, text, **kw):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text, **kw)
    return [d for d in e.value.diagnostics if d.severity == "error"]


# ---- plans that succeed and then fail at apply -------------------------------------
def test_hybrid_shard_is_refused_at_plan_time(tmp_path):  # item 3
    text = spec(extra='[distributed]\nstrategy = "fsdp"\nfsdp_sharding = "hybrid_shard"\n').replace(
        'gpu = "A100-80GB"', 'gpu = "A100-80GB"\ncount = 8\nnodes = 2'
    )
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
    (tmp_path / "a.txt").write_text("some text\n")
    plan = plan_text(
        tmp_path, spec(training=f'lr_scheduler_type = "{scheduler}"', data='seq_len = 512\neval_fraction = 0.1\ntrain_files = ["a.txt"]')
    )
    build_here(plan)  # and what the plan accepts, TrainingArguments accepts


def test_compile_mode_needs_inductor(tmp_path):  # item 10
    errs = errors_of(tmp_path, spec(training='torch_compile_backend = "aot_eager"\ntorch_compile_mode = "max-autotune"'))
    assert errs[0].key == "training.torch_compile_mode" and "inductor" in errs[0].summary
    plan = plan_text(tmp_path, spec(training='torch_compile_mode = "max-autotune"'))
    assert plan.value("training.torch_compile_backend") == "inductor"
    assert build_here(plan)["dynamo"].mode == "max-autotune"


# ---- reasons that say what happens --------------------------------------------------
@pytest.mark.parametrize("gpu", ["T4", "V100-32GB"])
def test_bf16_without_bf16_and_fp16_off_says_fp32(tmp_path, gpu):  # item 6
    plan = plan_text(tmp_path, spec(model="gpt2", gpu=gpu, training="bf16 = true\nfp16 = false"))
    assert plan.value("training.bf16") is False and plan.value("training.fp16") is False
    reason = change(plan, "training.bf16").reason
    assert "fp32" in reason and "fp16 mixed precision instead" not in reason
    fallback = plan_text(tmp_path, spec(model="gpt2", gpu=gpu, training="bf16 = true"))
    assert fallback.value("training.fp16") is True and "fp16 mixed precision instead" in change(fallback, "training.bf16").reason


def test_throughput_notes_say_the_communication_is_counted(tmp_path):  # item 9
    plan = plan_text(tmp_path, spec(gpu="H100-80GB").replace('gpu = "H100-80GB"', 'gpu = "H100-80GB"\ncount = 8'))
    t = plan.throughput
    assert t.communication["time_s"] > 0
    # the step-time model overlaps the collectives with compute; what is not hidden is in the step
    exposed = sum(x["exposed_s"] for x in t.step_time["terms"] if x["group"] == "communication")
    assert t.step_time_s == pytest.approx(t.compute_step_time_s + exposed)
    assert not any("not included" in n for n in t.notes)
    assert any(("includes" in n or "hide behind compute" in n) and "communication" in n for n in t.notes)


DS_OFFLOAD = """
[model]
config = "@MODELS@/llama-3.1-8b.json"
dtype = "bfloat16"
[hardware]
gpu = "H100-80GB"
count = 8
[data]
seq_len = 2048
[training]
effective_batch_size = 64
{training}
[distributed]
strategy = "deepspeed"
zero_stage = 3
offload_optimizer = true
"""


def test_deepspeed_optimizer_offload_says_deepspeed_runs_the_optimizer(tmp_path):  # item 10
    ds_env = {**ENV, "packages": {**ENV["packages"], "deepspeed": "0.19.8"}}
    plan = plan_text(tmp_path, DS_OFFLOAD.format(training=""), env=ds_env)
    reason = change(plan, "training.optim").reason
    assert "DeepSpeedCPUAdam" in reason and "fastest" not in reason
    assert "optimizer" in build_here(plan)["deepspeed"]  # DeepSpeed builds the optimizer
    asked = plan_text(tmp_path, DS_OFFLOAD.format(training='optim = "adafactor"'), env=ds_env)
    assert any(d.key == "training.optim" and "not used" in d.summary for d in asked.diagnostics)


@pytest.mark.parametrize("model,dtype,adam", [("phi-2", "bfloat16", 4), ("pythia-1.4b", "float32", 8)])
def test_eight_bit_saver_states_the_bytes_for_the_weight_dtype(tmp_path, model, dtype, adam):  # item 10
    plan = plan_text(
        tmp_path,
        spec(model=model, gpu="RTX-4090", extra=f'dtype = "{dtype}"', data="seq_len = 512", training="effective_batch_size = 8"),
        env=ENV,
    )
    savers = {s.name: s for s in plan.memory.savers}
    assert "8-bit optimizer" in savers, savers
    assert f"Adam states {adam} -> ~2 bytes" in savers["8-bit optimizer"].cost


def test_a_batch_that_does_not_divide_is_explained_as_such(tmp_path):  # item 7
    plan = plan_text(tmp_path, spec(training="effective_batch_size = 100\nper_device_train_batch_size = 30"))
    c = change(plan, "training.per_device_train_batch_size")
    assert "30 per device does not divide the 100 samples" in c.reason and "GiB" not in c.reason
    assert plan.value("training.per_device_train_batch_size") in (25, 50, 20)
    big = plan_text(
        tmp_path,
        spec(gpu="T4", model="gpt2", data="seq_len = 1024", training="effective_batch_size = 128\nper_device_train_batch_size = 128"),
    )
    c = change(big, "training.per_device_train_batch_size")
    assert "more than the" in c.reason and "GiB usable" in c.reason


# ---- the tensor-core rule on the dimensions that matter ---------------------------------
def test_vocabulary_padding_is_suggested_with_its_cost(tmp_path):  # item 12
    plan = plan_text(tmp_path, spec(model="gpt2", training="fp16 = true\nbf16 = false"))
    (note,) = [d for d in plan.diagnostics if "vocab_size" in d.summary]
    assert "50,257" in note.summary and "50,304" in note.detail and "47 rows" in note.detail
    assert "pad_to_multiple_of=64" in note.fix
    llama = plan_text(tmp_path, spec())  # 32000 = 500 x 64
    assert not any("vocab_size" in d.summary for d in llama.diagnostics)


def test_padded_length_is_suggested_as_a_multiple(tmp_path):  # item 12
    plan = plan_text(tmp_path, spec(model="bert-base-uncased", gpu="V100-16GB", data="seq_len = 100", extra='task = "seq-cls"'))
    (note,) = [d for d in plan.diagnostics if d.key == "data.seq_len"]
    assert "data.seq_len = 104" in note.fix


# ---- fixes that work -------------------------------------------------------------------
def _apply_fix(text: str, fix: str) -> str:
    """The spec text with one printed fix applied: every `section.key = value` in it."""
    import re

    import tomllib

    from tests.helpers.fuzz_toml import toml_doc

    doc = tomllib.loads(text)
    for key, value in re.findall(r'(\w+\.\w+) = ("[^"]*"|\d+)', fix):
        section, name = key.split(".")
        doc.setdefault(section, {})[name] = tomllib.loads(f"v = {value}")["v"]
    return toml_doc(doc)


def _no_fit(tmp_path, text):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text)
    (err,) = [d for d in e.value.diagnostics if d.summary.startswith("does not fit")]
    return err


def test_savers_the_spec_set_are_named_not_no_memory_saver(tmp_path):  # item 8
    text = spec(
        model="mistral-7b-v0.3",
        gpu="RTX-4090",
        extra='dtype = "bfloat16"',
        data="seq_len = 2048",
        training='effective_batch_size = 32\ngradient_checkpointing = true\noptim = "adamw_bnb_8bit"',
    )
    err = _no_fit(tmp_path, text)
    assert "no memory saver" not in err.summary
    assert "gradient checkpointing (set by the spec)" in err.summary and "adamw_bnb_8bit (set by the spec)" in err.summary


@pytest.mark.parametrize(
    "model,gpu,extra,data,training",
    [
        ("mistral-7b-v0.3", "RTX-4090", 'dtype = "bfloat16"', "seq_len = 2048", "effective_batch_size = 32"),
        ("mistral-7b-v0.3", "RTX-4090", "", "seq_len = 2048", "effective_batch_size = 32"),
        (
            "phi-2",
            "RTX-4090",
            'dtype = "bfloat16"',
            "seq_len = 2048",
            'effective_batch_size = 32\ngradient_checkpointing = false\noptim = "adamw_torch_fused"',
        ),
        ("qwen2.5-7b", "A100-40GB", "", "seq_len = 8192", "effective_batch_size = 16"),
        # no effective batch: more GPUs keep each GPU's samples; the spec's split is kept
        (
            "mistral-7b-v0.3",
            "RTX-4090",
            'dtype = "bfloat16"',
            "seq_len = 2048",
            "per_device_train_batch_size = 2\ngradient_accumulation_steps = 4",
        ),
        (
            "mistral-7b-v0.3",
            "RTX-4090",
            'dtype = "bfloat16"',
            "seq_len = 2048",
            "effective_batch_size = 24\ngradient_accumulation_steps = 3",
        ),
    ],
)
def test_every_printed_fix_makes_the_plan_fit_and_none_is_already_set(tmp_path, model, gpu, extra, data, training):  # item 11
    text = spec(model=model, gpu=gpu, extra=extra, data=data, training=training).replace("@MODELS@", str(MODELS))
    import re

    err = _no_fit(tmp_path, text)
    head = "any one of these fits (checked with the same memory model): "
    assert err.fix and (head in err.fix or err.fix.startswith("what fits (each planned in full)"))
    fixes = err.fix.split(head, 1)[1].split("; ") if head in err.fix else []
    fixes += re.findall(r"^    [^:]+: (.*?)  -> ", err.fix, re.M)  # the hardware alternatives (plan/fit/hardware_alternatives.py)
    assert fixes
    for fix in fixes:
        fixed = _apply_fix(text, fix)
        assert fixed != _apply_fix(text, ""), f"{fix} is already set"
        plan = plan_text(tmp_path, fixed)  # raises PlanError if the fix does not work
        assert plan.memory.fits, fix
    if 'dtype = "bfloat16"' in extra:
        assert 'model.dtype = "bfloat16"' not in err.fix


def test_no_more_gpus_where_sharding_cannot_help(tmp_path):  # item 11
    # 8 sequences of 262,144 tokens per device: the logits alone are thousands of GiB per GPU
    err = _no_fit(tmp_path, spec(model="gemma-2b", gpu="H100-80GB", extra='dtype = "bfloat16"', data="seq_len = 262144"))
    assert "hardware.count" not in (err.fix or "") and "hardware.gpu" not in (err.fix or "")
    assert "data.seq_len = " in err.fix


# ---- estimates ------------------------------------------------------------------------------
def test_fsdp_checkpointing_goes_through_fsdp_config(tmp_path):  # item 15
    text = (
        spec(
            model="llama-3.1-8b",
            gpu="H100-80GB",
            extra='dtype = "bfloat16"',
            data="seq_len = 4096",
            training="effective_batch_size = 64\ngradient_checkpointing = true",
        ).replace('gpu = "H100-80GB"', 'gpu = "H100-80GB"\ncount = 8')
        + '[distributed]\nstrategy = "fsdp"\n'
    )
    plan = plan_text(tmp_path, text)
    built = build_here(plan)
    assert built["args"].activation_checkpointing is False
    assert built["args"].fsdp_config["activation_checkpointing"] is True
    assert built["fsdp"].activation_checkpointing is True
    comm = plan.throughput.communication
    assert "no extra traffic" in comm["activation_checkpointing"]
    assert comm["formula"].startswith("2 all-gathers + reduce-scatter")


# ---- plans for other hardware ----------------------------------------------------------
TWO_NODES_ZERO3 = """
[model]
config = "@MODELS@/llama-3.1-8b.json"
dtype = "bfloat16"
[hardware]
gpu = "H100-80GB"
count = 8
nodes = 2
[data]
seq_len = 2048
[training]
effective_batch_size = 128
[distributed]
strategy = "deepspeed"
zero_stage = 3
offload_optimizer = true
"""
LOCAL_ENV = {**ENV, "cpu_count": 2, "host_memory_bytes": 8 * 2**30}  # this machine: 2 cores, 8 GiB, no deepspeed


def test_a_plan_for_other_machines_does_not_inherit_this_one(tmp_path):  # item 16
    plan = plan_text(tmp_path, TWO_NODES_ZERO3, env=LOCAL_ENV)
    # deepspeed is not installed here: kept, with what to install there
    assert plan.value("distributed.strategy") == "deepspeed"
    assert (plan.value("distributed.zero_stage"), plan.value("distributed.offload_optimizer")) == (3, True)
    assert any(d.key == "distributed.strategy" and "pip install deepspeed" in d.fix for d in plan.diagnostics)
    # 2 cores here: not the 8-GPU nodes' cores
    assert plan.value("training.dataloader_num_workers") == 8
    # 8 GiB of RAM here does not refuse the nodes' optimizer offload; the plan asks for their RAM
    assert any(d.key == "hardware.host_memory_gib" and d.severity == "note" for d in plan.diagnostics)
    ds = build_here(plan)["deepspeed"]
    assert ds["zero_optimization"]["stage"] == 3 and "offload_optimizer" in ds["zero_optimization"]
    # the target's facts, when the spec gives them, are checked
    small = TWO_NODES_ZERO3.replace("nodes = 2", "nodes = 2\ncpu_count = 16\nhost_memory_gib = 16")
    errs = errors_of(tmp_path, small, env=LOCAL_ENV)
    # the fit search rejects the offload the 16 GiB host cannot hold (plan/estimate/memory/host.py), and says so
    assert errs[0].key == "hardware.gpu" and "but its host RAM does not" in errs[0].detail
    assert "usable (hardware.host_memory_gib)" in errs[0].detail


def test_a_plan_for_this_machine_uses_its_facts(tmp_path):  # item 16
    from gpuplan.hardware.catalog import lookup

    here = TWO_NODES_ZERO3.replace('gpu = "H100-80GB"', 'gpu = "auto"').replace("nodes = 2", "nodes = 1")
    plan = plan_text(tmp_path, here, env={**LOCAL_ENV, "host_memory_bytes": 4096 * 2**30}, detect=lambda: lookup("H100-80GB"))
    assert plan.value("distributed.strategy") == "fsdp"  # deepspeed is not installed on this machine
    assert "pip install deepspeed" in change(plan, "distributed.strategy").reason
    assert plan.value("training.dataloader_num_workers") == 0  # 2 cores / 8 GPUs - 1


def test_gemma2_is_not_planned_with_sdpa(tmp_path):  # item 2
    plan = plan_text(tmp_path, spec(model="gemma-2-2b", extra='dtype = "bfloat16"'))
    c = change(plan, "model.attn_implementation")
    assert c.after == "eager" and "_supports_sdpa = False" in c.reason
    asked = plan_text(tmp_path, spec(model="gemma-2-2b", extra='dtype = "bfloat16"\nattn_implementation = "sdpa"'))
    assert asked.value("model.attn_implementation") == "eager"
    assert plan_text(tmp_path, spec()).value("model.attn_implementation") == "sdpa"  # llama: sdpa


def test_gemma2_really_refuses_sdpa_and_takes_eager(tmp_path):  # item 2: what the table says is what transformers does
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads((MODELS / "gemma-2-2b.json").read_text())
    cfg.update(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=64
    )
    config = AutoConfig.for_model(**cfg)
    with pytest.raises(ValueError, match="(?i)sdpa|scaled_dot_product"):
        AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    AutoModelForCausalLM.from_config(config, attn_implementation="eager")


# ---- not every GPU is an NVIDIA GPU ----------------------------------------------------
def test_mi300x_plan_speaks_amd(tmp_path):  # item 13
    from gpuplan.render.style import Style
    from gpuplan.render.text import render_plan

    text = spec(
        model="llama-3.1-8b",
        gpu="MI300X",
        extra='dtype = "bfloat16"\nattn_implementation = "flash_attention_2"',
        data="seq_len = 1001",
        training="effective_batch_size = 48\nper_device_train_batch_size = 6",
    )
    plan = plan_text(tmp_path, text)
    assert plan.value("model.attn_implementation") == "flash_attention_2"  # flash-attn's ROCm backend
    assert "matrix cores" in change(plan, "training.per_device_train_batch_size").reason
    out = render_plan(plan.to_dict(), Style(False))
    for words in ("nvidia-smi", "compute capability", "tensor core", "Ampere"):
        assert words.lower() not in out.lower(), words
    assert "rocm-smi" in out and "AMD CDNA2" in out


def test_mixtral_time_counts_active_parameters_and_memory_all(tmp_path):  # item 14
    import json

    from gpuplan.modelinfo import model_facts
    from gpuplan.plan.estimate.flops import flops_per_token

    facts = model_facts(json.loads((MODELS / "mixtral-8x7b-v0.1.json").read_text()), "causal-lm")
    assert facts.n_params == pytest.approx(46.7e9, rel=0.01)
    assert facts.active_params == pytest.approx(12.9e9, rel=0.01)  # top-2 of 8 experts
    model, _ = flops_per_token(facts, 4096, False)
    attention = 12 * facts.num_layers * facts.num_attention_heads * facts.head_dim * 4096
    assert model - attention < 6 * 13e9  # 6 x active (minus the input embedding lookup), not 6 x 46.7B
    plan = plan_text(
        tmp_path,
        spec(
            model="mixtral-8x7b-v0.1",
            gpu="H100-80GB",
            extra='dtype = "bfloat16"',
            data="seq_len = 2048",
            training="effective_batch_size = 64",
        ).replace('gpu = "H100-80GB"', 'gpu = "H100-80GB"\ncount = 8'),
    )
    assert plan.memory.components["weights"] >= 2 * facts.n_params / 8 * 0.99  # memory: all of them
    assert any("mixture of experts" in n for n in plan.throughput.notes)
    assert not any("no activation model" in n for n in plan.memory.notes)  # the MoE block is modelled


# ---- the reviewed specs apply where the CPU allows ---------------------------------------
@pytest.mark.slow
def test_warmup_ratio_and_an_eval_scheduler_train_for_real(tmp_path):  # items 1 and 5, applied
    import json

    from tests.helpers.cli_runs import command, env, run, tiny_spec

    path = tiny_spec(tmp_path / "spec.toml", tmp_path / "out", max_steps=4)
    text = (
        path.read_text()
        .replace("seed = 0", 'seed = 0\nwarmup_ratio = 0.25\nlr_scheduler_type = "reduce_lr_on_plateau"\neval_steps = 2')
        .replace("eval_fraction = 0.0", "eval_fraction = 0.01")
    )
    path.write_text(text)
    r = run(command("apply", path, "--yes"), capture_output=True, text=True, env=env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    state = json.loads((tmp_path / "out" / "gpuplan-state.json").read_text())
    assert state["plan"]["settings"]["training.warmup_steps"]["value"] == 1  # 0.25 x 4 steps


def test_apply_names_the_packages_a_plan_made_elsewhere_needs(tmp_path):  # item 16, at apply
    from importlib.util import find_spec

    from gpuplan.apply.errors import ApplyError
    from gpuplan.apply.launch.packages import check_packages

    if find_spec("deepspeed"):
        pytest.skip("deepspeed is installed here")
    plan = plan_text(tmp_path, TWO_NODES_ZERO3, env=LOCAL_ENV)  # deepspeed is not installed here
    with pytest.raises(ApplyError, match="distributed.strategy = 'deepspeed' needs deepspeed.*pip install deepspeed"):
        check_packages(plan)
    check_packages(plan_text(tmp_path, spec(training='optim = "adamw_bnb_8bit"')))  # bitsandbytes is here
