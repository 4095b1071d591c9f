"""Planning grpo / rloo: [rl] validation, TRL's defaults, the rewards checked at plan time (the file, the
function's signature read with ast, the columns), the generation batch, the backend on CPU, the reference,
vLLM's share and the generation's memory and time."""

from __future__ import annotations

import json

import pytest

from gpuplan.errors import GpuplanError
from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo import model_facts, read_config
from gpuplan.plan.build import plan_file
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.generation import kv_per_token, vllm_plan
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.types import PlanError
from gpuplan.spec.objectives import GRPO_NEEDS_SETTINGS, OBJECTIVES
from gpuplan.spec.validate import validate_spec
from tests.helpers.planning import ENV, SPECS
from tests.spec.test_schema_enums import KEYS, enum_of

QWEN_7B = str(SPECS / "models" / "qwen2.5-7b.json")
LLAMA_160M = str(SPECS / "models" / "llama-160m.json")
REWARD_OK = "def correct(prompts, completions, answer, **kwargs):\n    return [1.0 for _ in completions]\n"


def _rows(tmp_path, rows=None, name="prompts.jsonl"):
    rows = rows if rows is not None else [{"prompt": f"a -> {i}. The number is", "answer": str(i)} for i in range(16)]
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spec(tmp_path, *, rl="", rewards=None, gpu="A100-80GB", config=QWEN_7B, method="lora", training="", objective="grpo", data=None):
    _rows(tmp_path) if data is None else None
    rewards = rewards if rewards is not None else '[[rl.rewards]]\nkind = "exact-match"\ncolumn = "answer"\n'
    path = tmp_path / "grpo.toml"
    path.write_text(
        f'[model]\nconfig = "{config}"\nmethod = "{method}"\ndtype = "bfloat16"\n'
        f'[hardware]\ngpu = "{gpu}"\n'
        f'[data]\ntrain_files = ["{data or "prompts.jsonl"}"]\n'
        f'[training]\nobjective = "{objective}"\nmax_steps = 10\n{training}\n'
        f"[rl]\nmax_prompt_length = 128\nmax_completion_length = 256\n{rl}\n{rewards}"
    )
    return path


def _errors(path, **kw):
    with pytest.raises(PlanError) as e:
        plan_file(path, environment=ENV, **kw)
    return [d for d in e.value.diagnostics if d.severity == "error"]


def test_grpo_plans_with_trls_defaults_and_typed_settings(tmp_path):
    plan = plan_file(_spec(tmp_path), environment=ENV)
    rl = plan.resolved.rl
    assert plan.resolved.training.objective.trainer_class == "GRPOTrainer"
    assert (rl.num_generations, rl.beta, rl.loss_type, rl.reference) == (8, 0.0, "dapo", "none")  # GRPOConfig's defaults
    assert plan.resolved.training.learning_rate == 1e-6
    assert rl.generation_batch_size == 8 and rl.sequence_length == 384  # the Trainer's 8 per device, one GPU
    assert rl.rewards[0].name == "exact_match" and rl.reward_weights == [1.0] and rl.vllm_mode is None
    assert plan.memory.workload.seq_len == 384 and plan.memory.workload.generation == "transformers"
    assert plan.memory.components["generation"] > 0  # the round's tensors (and here the KV cache's moment)
    assert any(t["group"] == "generation" for t in plan.throughput.step_time["terms"])


def test_rloo_defaults_and_no_loss_type(tmp_path):
    plan = plan_file(_spec(tmp_path, objective="rloo", training="effective_batch_size = 8"), environment=ENV)
    rl = plan.resolved.rl
    assert plan.resolved.training.objective.trainer_class == "RLOOTrainer"
    assert (rl.num_generations, rl.beta, rl.loss_type, rl.reference) == (2, 0.05, None, "adapters-off")
    (e,) = _errors(_spec(tmp_path, objective="rloo", rl='loss_type = "grpo"'))
    assert e.key == "rl.loss_type" and "RLOOConfig has no loss_type" in e.summary


def test_the_reference_follows_beta_and_the_method(tmp_path):
    full = plan_file(_spec(tmp_path, config=LLAMA_160M, method="full", rl="beta = 0.04"), environment=ENV)
    assert full.resolved.rl.reference == "copy"
    none = plan_file(_spec(tmp_path, config=LLAMA_160M, method="full", rl="beta = 0.0"), environment=ENV)
    assert none.resolved.rl.reference == "none"
    # the frozen copy is in the memory: as many more weight bytes as a 16-bit copy of the model
    assert full.memory.components["weights"] - none.memory.components["weights"] == pytest.approx(
        model_facts(read_config(LLAMA_160M), "causal-lm").n_params * 2, rel=0.01
    )


def test_rl_keys_get_did_you_mean_inside_reward_tables():
    raw = {
        "model": {"config": "c.json"},
        "rl": {"num_generation": 4, "rewards": [{"kind": "exact-match", "colum": "answer"}, {"kind": "lenght"}]},
    }
    with pytest.raises(GpuplanError) as e:
        validate_spec(raw)
    by_key = {d.key: d for d in e.value.diagnostics}
    assert "did you mean num_generations" in by_key["rl.num_generation"].summary
    assert "did you mean column" in by_key["rl.rewards[0].colum"].summary
    assert by_key["rl.rewards[1].kind"].summary.startswith('rl.rewards[1].kind = "lenght": should be')


@pytest.mark.parametrize(
    ("reward", "needs"),
    [
        ({"kind": "exact-match"}, 'kind = "exact-match" needs column'),
        ({"kind": "regex"}, 'kind = "regex" needs pattern'),
        ({"kind": "regex", "pattern": "("}, "is not a Python regular expression"),
        ({"kind": "exact-match", "column": "a", "pattern": "\\d+"}, "has no group"),
        ({"kind": "function", "function": "rewards.py"}, 'is not "file.py:function"'),
        ({"kind": "length", "column": "a"}, 'kind = "length" does not read column'),
    ],
)
def test_reward_tables_are_validated(reward, needs):
    with pytest.raises(GpuplanError) as e:
        validate_spec({"model": {"config": "c.json"}, "rl": {"rewards": [reward]}})
    (d,) = e.value.diagnostics
    assert d.key == "rl.rewards[0]" and needs in d.summary


def _function_reward(tmp_path, source: str | None, ref="rewards.py:correct"):
    if source is not None:
        (tmp_path / "rewards.py").write_text(source)
    return f'[[rl.rewards]]\nkind = "function"\nfunction = "{ref}"\n'


@pytest.mark.parametrize(
    ("source", "ref", "says"),
    [
        (None, "rewards.py:correct", "rewards.py does not exist"),
        ("def correkt(prompts, completions, **kwargs):\n    return []\n", "rewards.py:correct", "did you mean correkt?"),
        ("correct = lambda prompts, completions, **kw: []\n", "rewards.py:correct", "is not a top-level `def`"),
        ("def correct(prompts, completions):\n    return []\n", "rewards.py:correct", "takes no **kwargs"),
        ("def correct(prompts, completions, /, **kwargs):\n    return []\n", "rewards.py:correct", "positional-only"),
        ("def correct(prompt, completions, **kwargs):\n    return []\n", "rewards.py:correct", "TRL never passes"),
        ("def correct(prompts, completions, solution, **kwargs):\n    return []\n", "rewards.py:correct", "no 'solution' column"),
        ("def correct(:\n", "rewards.py:correct", "is not valid Python"),
    ],
)
def test_a_bad_reward_function_is_refused_at_plan_time(tmp_path, source, ref, says):
    errors = _errors(_spec(tmp_path, rewards=_function_reward(tmp_path, source, ref)))
    assert any(says in e.summary and e.key.startswith("rl.rewards[0]") and e.fix for e in errors), [e.summary for e in errors]


def test_a_good_reward_function_plans_and_is_never_imported(tmp_path):
    # the file raises if imported: the plan reads its signature with ast only
    source = "raise SystemExit('imported at plan time')\n" + REWARD_OK
    plan = plan_file(_spec(tmp_path, rewards=_function_reward(tmp_path, source)), environment=ENV)
    (r,) = plan.resolved.rl.rewards
    assert r.function == f"{tmp_path / 'rewards.py'}:correct" and r.function_name == "correct" and r.name == "correct"


def test_a_reward_needing_a_column_the_rows_lack_is_an_error(tmp_path):
    _rows(tmp_path, [{"prompt": "a ->", "answer": "1"}, {"prompt": "b ->"}, {"prompt": "c ->"}], name="some.jsonl")
    (e,) = _errors(_spec(tmp_path, data="some.jsonl"))
    assert e.key == "data.train_files[0]" and "2 of 3 rows" in e.summary and "'answer'" in e.summary and "rl.rewards[0]" in e.summary
    assert "rows 2, 3" in e.summary and e.fix


def test_rows_without_a_prompt_and_overlong_prompts_are_reported(tmp_path):
    _rows(tmp_path, [{"prompt": "", "answer": "1"}, {"prompt": "x " * 300, "answer": "2"}], name="bad.jsonl")
    path = _spec(tmp_path, data="bad.jsonl", config=LLAMA_160M, method="full")  # no tokenizer: byte-level counts
    text = path.read_text().replace('config = "', 'from_scratch = true\nconfig = "')
    path.write_text(text)
    errors = _errors(path)
    summaries = " | ".join(e.summary for e in errors)
    assert "1 of 2 rows" in summaries and "have no prompt" in summaries
    assert "longer than rl.max_prompt_length = 128 tokens" in summaries and "set rl.max_prompt_length = 600" in " ".join(
        e.fix for e in errors
    )


def test_num_generations_must_divide_the_generation_batch(tmp_path):
    (e,) = _errors(_spec(tmp_path, training="effective_batch_size = 12"))
    assert e.key == "training.effective_batch_size" and "must be divisible by num_generations (8)" in e.summary
    assert e.fix == "set training.effective_batch_size = 8 or 16"
    plan_file(_spec(tmp_path, training="effective_batch_size = 16"), environment=ENV)  # the fix plans
    errors = _errors(_spec(tmp_path, rl="generation_batch_size = 12", training="effective_batch_size = 16"))
    (e,) = [e for e in errors if "num_generations" in e.summary]
    assert e.key == "rl.generation_batch_size" and e.fix == "set rl.generation_batch_size = 8 or 16"
    # and TRL's other check: whole global micro-batches (per-device batch x GPUs) per round
    plan = plan_file(_spec(tmp_path, rl="generation_batch_size = 32", training="effective_batch_size = 16"), environment=ENV)
    assert plan.resolved.rl.generation_batch_size == 32 and 32 % plan.resolved.training.per_device_train_batch_size == 0


def test_vllm_is_refused_on_cpu_with_the_reason(tmp_path):
    (e,) = _errors(_spec(tmp_path, gpu="cpu", config=LLAMA_160M, method="full", rl='generation_backend = "vllm-colocate"'))
    assert e.key == "rl.generation_backend" and "vLLM generates on CUDA GPUs only" in e.summary
    assert e.fix.startswith('set rl.generation_backend = "transformers"')


def test_rl_loss_type_enum_is_every_loss_grpo_plans(tmp_path):
    values = enum_of(KEYS["rl.loss_type"])
    assert values[0] == "auto" and not set(values) & set(GRPO_NEEDS_SETTINGS)
    assert set(values) - {"auto"} == set(OBJECTIVES["grpo"].loss_types) - set(GRPO_NEEDS_SETTINGS)
    for loss in values:
        plan = plan_file(_spec(tmp_path, rl=f'loss_type = "{loss}"'), environment=ENV)
        assert plan.resolved.rl.loss_type == ("dapo" if loss == "auto" else loss)
    (e,) = _errors(_spec(tmp_path, rl='loss_type = "dapox"'))
    assert 'did you mean "dapo"' in e.summary
    for loss in GRPO_NEEDS_SETTINGS:
        (e,) = _errors(_spec(tmp_path, rl=f'loss_type = "{loss}"'))
        assert e.key == "rl.loss_type" and "no [rl] key sets" in e.summary


def test_vllm_colocate_takes_the_smallest_share_that_holds_a_round(tmp_path):
    plan = plan_file(
        _spec(tmp_path, gpu="H100-80GB", rl='generation_backend = "vllm-colocate"', training="effective_batch_size = 64"), environment=ENV
    )
    share = plan.resolved.rl.vllm_gpu_memory_utilization
    wl = plan.memory.workload
    facts = model_facts(read_config(QWEN_7B), "causal-lm")
    gpu = lookup("H100-80GB")
    vp = vllm_plan(facts, wl, gpu)
    # 64 sequences of 384 tokens fit the share's KV cache, and one step (0.05) less would not hold them
    assert vp.share == share and vp.concurrent == 64 == wl.generation_sequences
    assert (share - 0.05) * gpu.memory_bytes < vp.needed_bytes <= share * gpu.memory_bytes
    assert vp.weight_bytes == facts.n_params * 2  # vLLM's own 16-bit copy
    assert plan.memory.components["generation"] >= vp.share_bytes  # held beside training the whole run
    assert "vLLM's share" in next(c.reason for c in plan.changes if c.key == "rl.vllm_gpu_memory_utilization")


def test_sleep_mode_frees_the_share_while_training(tmp_path):
    awake = _spec(tmp_path, gpu="H100-80GB", rl='generation_backend = "vllm-colocate"\nvllm_gpu_memory_utilization = 0.5')
    a = plan_file(awake, environment=ENV)
    asleep = awake.read_text().replace(
        "vllm_gpu_memory_utilization = 0.5", "vllm_gpu_memory_utilization = 0.5\nvllm_enable_sleep_mode = true"
    )
    awake.write_text(asleep)
    b = plan_file(awake, environment=ENV)
    assert a.memory.reserved_peak_bytes > b.memory.reserved_peak_bytes  # training no longer beside vLLM's 40 GiB


def test_transformers_generation_kv_cache_is_priced_at_its_moment():
    facts = model_facts(read_config(QWEN_7B), "causal-lm")
    gpu = lookup("A100-80GB")
    adapters = Adapters("lora", 16, ("q_proj",))
    base = Workload(per_device_batch=4, seq_len=1024, weight_dtype="bfloat16", amp="bf16", objective="grpo", adapters=adapters)
    small = estimate_memory(
        facts, Workload(**{**base.__dict__, "generation": "transformers", "rl_completion_len": 512, "generation_sequences": 4}), gpu
    )
    big = estimate_memory(
        facts, Workload(**{**base.__dict__, "generation": "transformers", "rl_completion_len": 512, "generation_sequences": 256}), gpu
    )
    kv = 256 * 1024 * kv_per_token(facts, 2)
    assert "generation moment" in " ".join(big.notes)
    assert big.components["generation"] >= kv and big.reserved_peak_bytes > small.reserved_peak_bytes


def test_a_vllm_server_is_paid_beside_the_training_gpus(tmp_path):
    plan = plan_file(_spec(tmp_path, gpu="H100-80GB", rl='generation_backend = "vllm-server"\nvllm_server_gpus = 2'), environment=ENV)
    t = plan.throughput
    assert plan.resolved.rl.vllm_server_gpus == 2 and plan.memory.components["generation"] < 2**30  # no vLLM on the training GPU
    assert t.cost_usd == pytest.approx(t.run_time_s / 3600 * 3 * t.price_per_gpu_hour)  # 1 training + 2 server GPUs


def test_an_rl_plan_survives_its_json(tmp_path):
    from gpuplan.plan.types import Plan

    plan = plan_file(_spec(tmp_path, gpu="H100-80GB", rl='generation_backend = "vllm-colocate"'), environment=ENV)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.resolved.rl == plan.resolved.rl and again.memory.workload == plan.memory.workload
    assert again.memory.components["generation"] == plan.memory.components["generation"] > 0


def test_a_full_grpo_that_does_not_fit_keeps_its_reference_copy_and_its_fixes_plan(tmp_path):
    path = _spec(
        tmp_path, gpu="A100-40GB", method="full", rl="beta = 0.04\nmax_completion_length = 1024", training="effective_batch_size = 16"
    )
    path.write_text(path.read_text().replace("max_completion_length = 256\n", ""))
    (e,) = _errors(path)  # TRL's online trainers cannot precompute the reference: no "precomputed" saver
    assert e.key == "hardware.gpu" and "does not fit" in e.summary and "hardware.count = 2" in e.fix
    path.write_text(path.read_text().replace('gpu = "A100-40GB"', 'gpu = "A100-40GB"\ncount = 2'))
    plan = plan_file(path, environment=ENV)  # the fix, followed, plans
    assert plan.memory.fits and plan.resolved.rl.reference == "copy" and plan.memory.workload.generation_sequences == 8


def test_a_vllm_server_too_small_for_the_model_is_refused(tmp_path):
    big = str(SPECS / "models" / "llama-3.1-70b.json")
    (e,) = [
        e
        for e in _errors(_spec(tmp_path, config=big, method="full", gpu="H100-80GB", rl='generation_backend = "vllm-server"'))
        if e.key == "rl.vllm_tensor_parallel_size"
    ]
    assert "does not hold the model" in e.summary and e.fix == "set rl.vllm_tensor_parallel_size = 2 and rl.vllm_server_gpus = 2"
    # the fix, followed: the server holds it (the 70B's full fine-tune still needs more training GPUs)
    path = tmp_path / "grpo.toml"
    path.write_text(
        path.read_text().replace(
            'generation_backend = "vllm-server"', 'generation_backend = "vllm-server"\nvllm_tensor_parallel_size = 2\nvllm_server_gpus = 2'
        )
    )
    assert not [e for e in _errors(path) if e.key.startswith("rl.")]


def test_zero3_generation_gathers_the_whole_model():
    facts = model_facts(read_config(QWEN_7B), "causal-lm")
    gpu = lookup("H100-80GB")
    wl = Workload(
        per_device_batch=1, seq_len=1024, weight_dtype="bfloat16", amp="bf16", objective="grpo", engine="deepspeed", zero_stage=3,
        shard_world_size=8, generation="transformers", rl_completion_len=512, generation_sequences=64,
    )  # fmt: skip
    est = estimate_memory(facts, wl, gpu)
    assert "the peak is the generation moment" in " ".join(est.notes)  # 64 sequences' KV cache beside the weights
    assert est.components["weights"] >= facts.n_params * 2  # trl/models/utils.py: GatheredParameters(model.parameters())
