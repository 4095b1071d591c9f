"""Planning dpo / kto: the objective axis, [preference] validation, the reference, the doubled
sequences, the step time, and unusable preference rows reported at plan time."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from gpuplan.errors import GpuplanError
from gpuplan.hardware.catalog import lookup
from gpuplan.lifecycle.drift import resume_conflicts
from gpuplan.modelinfo import model_facts, read_config
from gpuplan.plan.build import plan_file
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.preference import reference_element_bytes
from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.estimate.throughput import estimate_throughput
from gpuplan.plan.types import PlanError
from gpuplan.spec.objectives import OBJECTIVES
from tests.helpers.planning import ENV, SPECS
from tests.helpers.preference_rows import pairs, write_jsonl

LLAMA_8B = str(SPECS / "models" / "llama-3.1-8b.json")
LLAMA_1B = str(SPECS / "models" / "llama-3.2-1b.json")


def _spec(tmp_path, body: str, name: str = "dpo.toml"):
    path = tmp_path / name
    path.write_text(body)
    return path


def _dpo(tmp_path, *, config=LLAMA_8B, method="lora", gpu="A100-80GB", extra="", preference="", data=""):
    return _spec(
        tmp_path,
        f"""
[model]
config = "{config}"
method = "{method}"
dtype = "bfloat16"

[hardware]
gpu = "{gpu}"

[data]
seq_len = 2048
{data}
[training]
objective = "dpo"
effective_batch_size = 64
max_steps = 100
{extra}
[preference]
{preference}
""",
    )


def _errors(exc) -> list:
    return [d for d in exc.value.diagnostics if d.severity == "error"]


def test_stable_trl_trainers_only_and_sft_is_the_default():
    import trl

    assert set(OBJECTIVES) == {"sft", "dpo", "kto", "grpo", "rloo"}  # grpo / rloo: tests/plan/test_rl_plan.py
    for o in OBJECTIVES.values():
        if o.trl_module:  # the classes the descriptor names exist in the installed TRL's stable API
            assert hasattr(trl, o.trainer_class) and hasattr(trl, o.config_class)
    assert (
        Workload(1, 8).to_dict().keys().isdisjoint({"objective", "reference", "generation", "generation_sequences"})
    )  # SFT JSON unchanged


def test_sft_plans_read_no_preference_key(shipped_plans):
    plan = shipped_plans["tiny.toml"]
    assert plan.value("training.objective") == "sft"
    assert not any(c.key.startswith("preference.") for c in plan.changes)
    assert plan.memory.workload.objective == "sft" and plan.memory.workload.reference == "none"


@pytest.mark.parametrize(
    "value,words",
    [
        ("orpo", ["experimental", 'set training.objective = "dpo"']),
        ("dop", ['did you mean "dpo"']),
    ],
)
def test_objectives_outside_the_stable_trainers_are_refused_with_the_reason(tmp_path, value, words):
    path = _dpo(tmp_path, extra="")
    path.write_text(path.read_text().replace('objective = "dpo"', f'objective = "{value}"'))
    with pytest.raises(GpuplanError) as e:
        plan_file(path, environment=ENV)
    d = next(d for d in e.value.diagnostics if d.key == "training.objective")
    for w in words:
        assert w in d.summary


def test_preference_keys_get_did_you_mean_and_a_fix(tmp_path):
    with pytest.raises(GpuplanError) as e:
        plan_file(_dpo(tmp_path, preference="betta = 0.2"), environment=ENV)
    d = e.value.diagnostics[0]
    assert d.key == "preference.betta" and "did you mean beta" in d.summary and d.fix == "rename preference.betta to preference.beta"
    with pytest.raises(GpuplanError) as e:
        plan_file(_dpo(tmp_path, preference='reference = "model"'), environment=ENV)
    assert "needs preference.reference_model" in e.value.diagnostics[0].summary
    with pytest.raises(PlanError) as e:
        plan_file(_dpo(tmp_path, preference='loss_type = "sigmod"'), environment=ENV)
    d = _errors(e)[0]
    assert d.key == "preference.loss_type" and 'did you mean "sigmoid"' in d.summary
    assert d.fix == 'set preference.loss_type = "sigmoid"'


def test_8b_lora_dpo_plans_the_base_with_adapters_off_and_two_sequences_per_example(tmp_path):
    plan = plan_file(_dpo(tmp_path), environment=ENV)
    changes = {c.key: c for c in plan.changes}
    assert plan.value("preference.reference") == "adapters-off"
    assert "base with adapters disabled (peft), no second copy of the weights" in changes["preference.reference"].reason
    assert plan.value("preference.beta") == 0.1 and plan.value("preference.loss_type") == "sigmoid"
    assert "TRL's default" in changes["preference.beta"].reason
    b = plan.value("training.per_device_train_batch_size")
    note = next(d for d in plan.diagnostics if d.key == "training.objective")
    assert f"per-device batch {b} examples = {2 * b} sequences of 2048 tokens" in note.summary
    assert plan.value("data.packing") is False
    # time: 2 sequences per example, forward + backward, plus the reference's forward
    assert plan.throughput.tokens_per_step == 64 * 2 * 2048
    wl = plan.memory.workload
    assert wl.objective == "dpo" and wl.reference == "adapters-off"


def test_the_reference_copy_and_the_doubled_sequences_in_memory():
    facts = model_facts(read_config(LLAMA_1B), "causal-lm", 2)
    sft = Workload(2, 1024, amp="bf16")
    copy = estimate_memory(facts, dataclasses.replace(sft, objective="dpo", reference="copy"))
    pre = estimate_memory(facts, dataclasses.replace(sft, objective="dpo", reference="precomputed"))
    # the frozen copy: every parameter in the policy's dtype (fp32 weights under bf16 autocast), as TRL
    # builds it (trl/trainer/dpo_trainer.py dtype=self.model.dtype)
    assert copy.components["weights"] - pre.components["weights"] == 4 * facts.n_params
    bf16 = dataclasses.replace(sft, weight_dtype="bfloat16", objective="dpo")
    assert (
        estimate_memory(facts, dataclasses.replace(bf16, reference="copy")).components["weights"]
        - estimate_memory(facts, dataclasses.replace(bf16, reference="precomputed")).components["weights"]
        == 2 * facts.n_params
    )
    # two sequences per example: about twice SFT's activations at the same per-device batch
    twice = estimate_memory(facts, dataclasses.replace(sft, per_device_batch=4))
    assert pre.components["activations"] == pytest.approx(twice.components["activations"], rel=0.05)


def test_step_time_counts_both_sequences_and_the_reference_forward():
    facts = model_facts(read_config(LLAMA_8B), "causal-lm", 2)
    gpu = lookup("H100-80GB")
    sft = Workload(1, 2048, amp="bf16")
    t_sft = estimate_throughput(facts, sft, gpu, max_steps=10)
    t_two = estimate_throughput(facts, dataclasses.replace(sft, per_device_batch=2), gpu, max_steps=10)
    t_dpo = estimate_throughput(facts, dataclasses.replace(sft, objective="dpo", reference="copy"), gpu, max_steps=10)
    t_pre = estimate_throughput(facts, dataclasses.replace(sft, objective="dpo", reference="precomputed"), gpu, max_steps=10)
    # FLOPs: policy forward + backward on 2 sequences (2 x 3 forwards) + the reference forward on both (2)
    assert t_dpo.flops_per_step / t_sft.flops_per_step == pytest.approx(8 / 3, rel=1e-6)
    assert t_pre.flops_per_step / t_sft.flops_per_step == pytest.approx(2, rel=1e-6)
    assert t_dpo.tokens_per_step == 2 * t_sft.tokens_per_step
    # time: the policy's step is SFT's on two sequences; the reference forward is one more term
    assert t_pre.step_time_s == pytest.approx(t_two.step_time_s, rel=1e-6)
    terms = {t["name"]: t["seconds"] for t in t_dpo.step_time["terms"]}
    ref = terms["dpo forwards without gradients"]
    assert t_dpo.step_time_s == pytest.approx(t_pre.step_time_s + ref, rel=0.02)
    # precomputed: the same reference forwards run once, before training, and are in the run time
    assert t_pre.run_time_s == pytest.approx(10 * t_pre.step_time_s + 10 * ref, rel=1e-6)


def test_precomputed_log_probs_are_the_saver_when_a_reference_copy_does_not_fit(tmp_path):
    plan = plan_file(_dpo(tmp_path, method="full", gpu="A100-40GB"), environment=ENV)
    assert plan.value("preference.reference") == "precomputed"
    assert "would need more memory savers" in next(c.reason for c in plan.changes if c.key == "preference.reference")
    saver = next(s for s in plan.memory.savers if s.name == "precomputed reference log-probs")
    assert saver.saved_bytes == 2 * plan.model.total_params and "before training" in saver.cost
    # a reference model asked for explicitly is kept: then the run does not fit
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "config.json").write_text((SPECS / "models" / "llama-3.1-8b.json").read_text())
    spec = _dpo(tmp_path, method="full", gpu="A100-40GB", preference='reference = "model"\nreference_model = "ref"')
    with pytest.raises(PlanError, match="does not fit"):
        plan_file(spec, environment=ENV)
    # where the copy fits with the same savers, it is kept
    assert plan_file(_dpo(tmp_path, method="full", gpu="H100-80GB"), environment=ENV).value("preference.reference") == "copy"


def test_a_reference_model_that_is_not_there_is_an_error(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_file(_dpo(tmp_path, preference='reference = "model"\nreference_model = "nowhere"'), environment=ENV)
    d = _errors(e)[0]
    assert d.key == "preference.reference_model" and str(tmp_path / "nowhere") in d.summary


def test_unusable_rows_are_counted_and_reported_at_plan_time(tmp_path):
    rows = pairs(10)
    rows[1] = {"prompt": "x", "chosen": "", "rejected": " y"}
    rows[4] = {"prompt": "x", "rejected": " y"}
    rows[6] = dict(rows[6], prompt="p" * 100)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.raises(PlanError) as e:
        plan_file(_dpo(tmp_path, data=f'train_files = ["{data}"]', preference="max_prompt_length = 50"), environment=ENV)
    got = {d.summary for d in _errors(e)}
    assert f"data.train_files[0]: 1 of 10 dpo rows in {data} has an empty chosen (rows 1)" in got
    assert f"data.train_files[0]: 1 of 10 dpo rows in {data} has no chosen (rows 4)" in got
    assert (
        f"data.train_files[0]: 1 of 10 dpo rows in {data} has a prompt longer than preference.max_prompt_length = 50 tokens (rows 6)"
    ) in got
    assert json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])  # the data is left as it was


@pytest.mark.parametrize(
    ("preference", "key"),
    [
        ("beta = 0.5", "preference.beta"),
        ('loss_type = "ipo"', "preference.loss_type"),
        ('reference = "precomputed"', "preference.reference"),
        ("", "training.objective"),  # the same spec as SFT
    ],
)
def test_a_changed_preference_loss_refuses_to_resume_the_run(tmp_path, preference, key):
    """apply resumes only a run whose loss is the same (lifecycle/drift.py): beta, the loss, the reference
    and the objective each break it, for LoRA as for full fine-tuning; an unchanged spec does not."""
    for method in ("lora", "full"):
        d = tmp_path / method
        d.mkdir()
        old = plan_file(_dpo(d, method=method, gpu="H100-80GB"), environment=ENV)
        assert resume_conflicts(old, plan_file(_dpo(d, method=method, gpu="H100-80GB"), environment=ENV)) == []
        if key == "training.objective":
            changed = _dpo(d, method=method, gpu="H100-80GB").read_text().replace('objective = "dpo"', 'objective = "sft"')
            new_path = _spec(d, changed.replace("[preference]\n", ""), "sft.toml")
        else:
            new_path = _dpo(d, method=method, gpu="H100-80GB", preference=preference)
        conflicts = resume_conflicts(old, plan_file(new_path, environment=ENV))
        assert [c.split(":")[0] for c in conflicts if c.startswith(key)] == [key], (method, conflicts)


@pytest.mark.parametrize("objective,reference", [("dpo", "copy"), ("dpo", "precomputed"), ("kto", "copy")])
def test_a_calibration_scales_the_no_grad_forwards_once_like_every_other_term(objective, reference):
    # issue 30 item 9: the no-grad forward term was built from the already calibrated policy terms and then
    # scaled again with them (x 9 for a x 3 calibration). One scaling: each term of the calibrated DPO/KTO
    # plan is its uncalibrated self times the factor of its kind (step_time/model.py scaled_term), the same
    # factor as SFT's terms, and on a CPU (everything adds) the step is the sum of those terms.
    facts = model_facts(read_config(str(SPECS / "models" / "tiny-llama-cpu.json")), "causal-lm", 2)
    cpu = lookup("cpu")
    scale = {"work": 3.0, "fixed": 3.0}

    def ratios(wl):
        plain = estimate_throughput(facts, wl, cpu, max_steps=10)
        calibrated = estimate_throughput(facts, wl, cpu, max_steps=10, scale=scale)
        before = {t["name"]: t["exposed_s"] for t in plain.step_time["terms"]}
        after = {t["name"]: t["exposed_s"] for t in calibrated.step_time["terms"]}
        assert calibrated.step_time_s == pytest.approx(sum(after.values()), rel=1e-9)
        return plain, calibrated, {name: after[name] / before[name] for name in before}

    _, _, sft = ratios(Workload(2, 128))
    plain, calibrated, pref = ratios(Workload(2, 128, objective=objective, reference=reference))
    assert sft["matmuls"] == pytest.approx(3.0)
    for name, r in pref.items():
        assert r == pytest.approx(sft.get(name, sft["matmuls"]), rel=1e-9), name
    if reference == "precomputed":  # the precomputing pass is the same device work, scaled once too
        pass_plain = plain.run_time_s - 10 * plain.step_time_s
        assert calibrated.run_time_s - 10 * calibrated.step_time_s == pytest.approx(3.0 * pass_plain, rel=1e-9)
    else:
        assert f"{objective} forwards without gradients" in pref


def test_deepspeed_zero3_shards_the_reference_copy_as_trl_does(tmp_path):
    # issue 30 item 11: trl/models/utils.py prepare_deepspeed initialises the reference with the policy's
    # ZeRO-3 config ("we shard both the active and reference model"); other stages run it at stage 0, whole.
    facts = model_facts(read_config(LLAMA_8B), "causal-lm", 2)
    zero3 = Workload(2, 2048, amp="bf16", engine="deepspeed", zero_stage=3, shard_world_size=8, objective="dpo")
    copy = estimate_memory(facts, dataclasses.replace(zero3, reference="copy"))
    pre = estimate_memory(facts, dataclasses.replace(zero3, reference="precomputed"))
    b = reference_element_bytes(zero3)  # the policy's dtype for a full fine-tune (fp32 here: 4 bytes)
    assert b == 4
    small = sum(math.prod(s) for _, s in facts.param_shapes if math.prod(s) < 10 * facts.hidden_size)  # TRL's persistence threshold
    assert copy.components["weights"] - pre.components["weights"] == b * (-(-facts.n_params // 8) + small)
    offloaded = estimate_memory(facts, dataclasses.replace(zero3, reference="copy", offload_params=True))
    offloaded_pre = estimate_memory(facts, dataclasses.replace(zero3, reference="precomputed", offload_params=True))
    assert offloaded.components["weights"] - offloaded_pre.components["weights"] == b * small  # offload_param is kept
    assert offloaded.host_bytes - offloaded_pre.host_bytes == b * -(-facts.n_params // 8)
    # FSDP full_shard: trl prepare_fsdp fully_shards the reference with the policy's reshard_after_forward=True
    fsdp = dataclasses.replace(zero3, engine="fsdp")
    assert estimate_memory(facts, dataclasses.replace(fsdp, reference="copy")).components["weights"] - estimate_memory(
        facts, dataclasses.replace(fsdp, reference="precomputed")
    ).components["weights"] == b * -(-facts.n_params // 8)
    zero2 = dataclasses.replace(zero3, zero_stage=2)
    whole = estimate_memory(facts, dataclasses.replace(zero2, reference="copy"))
    assert (
        whole.components["weights"] - estimate_memory(facts, dataclasses.replace(zero2, reference="precomputed")).components["weights"]
        == b * facts.n_params
    )

    # the plan: 8B full DPO on 8 x A100-40GB under ZeRO-3 keeps the copy (1/8 of it per GPU), where counting it
    # whole on every GPU switched to precomputed log-probs
    zero3_on_8 = {"hardware": {"gpu": "A100-40GB", "count": 8}, "distributed": {"strategy": "deepspeed", "zero_stage": 3}}
    plan = plan_file(_dpo(tmp_path, method="full"), environment=ENV, overrides=zero3_on_8)
    assert plan.value("preference.reference") == "copy"
    reason = next(c.reason for c in plan.changes if c.key == "preference.reference")
    assert "sharded over 8 GPUs as TRL shards it under DeepSpeed ZeRO-3: 1.87 GiB per GPU" in reason
    assert not any(s.name == "precomputed reference log-probs" for s in plan.memory.savers)


@pytest.mark.parametrize("objective", ["dpo", "kto"])
def test_the_learning_rate_defaults_to_trls_for_the_objective_and_a_set_one_is_kept(tmp_path, objective):
    path = _dpo(tmp_path)
    path.write_text(path.read_text().replace('objective = "dpo"', f'objective = "{objective}"'))
    plan = plan_file(path, environment=ENV)
    change = next(c for c in plan.changes if c.key == "training.learning_rate")
    assert plan.value("training.learning_rate") == 1e-6  # trl/trainer/dpo_config.py, kto_config.py
    assert change.reason.startswith(f"{objective}: TRL's default learning rate") and "50x" in change.reason
    path.write_text(path.read_text().replace("max_steps = 100", "max_steps = 100\nlearning_rate = 5e-6"))
    plan = plan_file(path, environment=ENV)
    assert plan.value("training.learning_rate") == 5e-6
    assert not any(c.key == "training.learning_rate" for c in plan.changes)


def _kto(tmp_path, *, gpu, seq_len=2048, extra="", loss="", data=""):
    path = _dpo(tmp_path, method="qlora", gpu=gpu, extra=extra, preference=loss, data=data)
    text = path.read_text().replace('objective = "dpo"', 'objective = "kto"').replace("seq_len = 2048", f"seq_len = {seq_len}")
    path.write_text(text)
    return path


def test_kto_never_plans_a_per_device_batch_of_one(tmp_path):
    """TRL's KTOTrainer refuses a per-device batch of 1 ("Actual (not effective) batch size must be > 1",
    trl/trainer/kto_trainer.py): the fit search does not choose it, and a spec that sets it is refused."""
    # 8B QLoRA KTO at 8192 tokens on a 4090: batch 1 would fit, batch 2 does not
    with pytest.raises(PlanError) as e:
        plan_file(_kto(tmp_path, gpu="RTX-4090", seq_len=8192), environment=ENV)
    assert "does not fit: needs" in _errors(e)[0].summary and "at per-device batch 2" in _errors(e)[0].summary
    with pytest.raises(PlanError) as e:
        plan_file(_kto(tmp_path, gpu="A100-80GB", extra="per_device_train_batch_size = 1"), environment=ENV)
    (d,) = _errors(e)
    assert d.key == "training.per_device_train_batch_size" and "needs a per-device batch of at least 2" in d.summary
    assert d.fix == "set training.per_device_train_batch_size = 2"
    plan = plan_file(_kto(tmp_path, gpu="A100-80GB", extra="per_device_train_batch_size = 2"), environment=ENV)  # the fix, followed
    assert plan.value("training.per_device_train_batch_size") == 2
    # apo_zero_unpaired computes no KL term: TRL runs it at batch 1
    plan = plan_file(_kto(tmp_path, gpu="RTX-4090", seq_len=8192, loss='loss_type = "apo_zero_unpaired"'), environment=ENV)
    assert plan.value("training.per_device_train_batch_size") == 1


@pytest.mark.parametrize("loss,words", [("exo_pair", "TRL's DPOTrainer refuses 0.0"), ("robust", "exactly the sigmoid loss")])
def test_losses_that_need_label_smoothing_are_refused_not_run_as_something_else(tmp_path, loss, words):
    with pytest.raises(PlanError) as e:
        plan_file(_dpo(tmp_path, preference=f'loss_type = "{loss}"'), environment=ENV)
    (d,) = _errors(e)
    assert d.key == "preference.loss_type" and words in d.summary and d.fix == 'set preference.loss_type = "sigmoid"'
    assert plan_file(_dpo(tmp_path, preference='loss_type = "sigmoid"'), environment=ENV)  # the fix, followed


def test_rows_with_a_plain_prompt_and_message_answers_are_refused_at_plan_and_by_init(tmp_path):
    """UltraFeedback's layout: TRL reads one field to decide the row's form (trl/data_utils.py
    is_conversational) and then fails on the others; refused with the fix, init writes no spec."""
    from tests.helpers.cli_runs import gpuplan

    rows = [
        dict(r, chosen=[{"role": "assistant", "content": r["chosen"]}], rejected=[{"role": "assistant", "content": r["rejected"]}])
        for r in pairs(4)
    ]
    data = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(PlanError) as e:
        plan_file(_dpo(tmp_path, data=f'train_files = ["{data}"]\nformat = "chat"\nchat_template = "chatml"'), environment=ENV)
    (d,) = _errors(e)
    assert (
        d.summary
        == f"data.train_files[0]: 4 of 4 dpo rows in {data} mixes plain text and lists of messages across its fields (rows 0, 1, 2, 3)"
    )
    assert d.fix.startswith('write every field of a row in one form: the prompt as a list of messages ([{"role": "user"')
    out = tmp_path / "init.toml"
    r = gpuplan("init", LLAMA_1B, "--gpu", "A100-80GB", "--data", data, "--out", out)
    assert r.returncode == 1 and "mixes plain text and lists of messages" in r.stderr and not out.exists()
    assert "Traceback" not in r.stderr


def test_conversational_rows_under_the_text_format_plan_as_chat(tmp_path):
    """TRL renders conversational rows with the chat template whatever data.format says
    (trl/data_utils.py maybe_apply_chat_template); the plan says chat, so generate / chat / samples
    prompt through the same template (apply/data/prompting.py reads data.format)."""
    from tests.helpers.preference_rows import conversational

    data = write_jsonl(tmp_path / "chat.jsonl", conversational(pairs(4)))
    with pytest.raises(PlanError) as e:  # a config-only spec: no tokenizer, so no template to render them
        plan_file(_dpo(tmp_path, data=f'train_files = ["{data}"]'), environment=ENV)
    (d,) = _errors(e)
    assert d.key == "data.format" and "4 dpo rows are conversational" in d.summary
    assert d.fix == 'set data.format = "chat" and data.chat_template = "chatml"'
    plan = plan_file(_dpo(tmp_path, data=f'train_files = ["{data}"]\nchat_template = "chatml"'), environment=ENV)
    assert plan.value("data.format") == "chat"
    change = next(c for c in plan.changes if c.key == "data.format")
    assert change.reason.startswith("4 dpo rows are conversational (lists of messages): TRL renders them with the chat template")
    text = write_jsonl(tmp_path / "plain.jsonl", pairs(4))
    plan = plan_file(_dpo(tmp_path, data=f'train_files = ["{text}"]'), environment=ENV)
    assert plan.value("data.format") == "text" and not any(c.key == "data.format" for c in plan.changes)


def test_apo_zero_unpaired_prices_no_kl_forwards(tmp_path):
    """Issue 30: TRL's KTOTrainer computes the KL term for every loss but apo_zero_unpaired
    (trl/trainer/kto_trainer.py `__init__`: calculate_kl = args.loss_type not in ["apo_zero_unpaired"]), so
    that loss runs no KL completion through the policy nor the reference. The plans differ by exactly those
    two forwards per example: in the step FLOPs and the no-grad forward term; memory prices no KL part."""
    extra = "per_device_train_batch_size = 2"
    kto = plan_file(_kto(tmp_path, gpu="A100-80GB", extra=extra), environment=ENV)
    apo = plan_file(_kto(tmp_path, gpu="A100-80GB", extra=extra, loss='loss_type = "apo_zero_unpaired"'), environment=ENV)
    assert kto.value("preference.loss_type") == "kto" and apo.value("preference.loss_type") == "apo_zero_unpaired"
    assert kto.memory.workload.loss_type == "kto" and apo.memory.workload.loss_type == "apo_zero_unpaired"
    t_kto, t_apo = kto.throughput.to_dict(), apo.throughput.to_dict()
    assert t_kto["tokens_per_step"] == t_apo["tokens_per_step"]

    # per example: policy forward + backward (3 forwards) and the reference's completion forward (1), both;
    # kto adds the KL completion through the policy and through the reference (2 more): 6 / 4 forwards
    def nograd(t):  # the step's forwards without gradients: the model FLOPs beyond the graded sequences'
        return t["model_flops_per_step"] - t["model_flops_per_token"] * t["tokens_per_step"]

    assert nograd(t_apo) > 0 and nograd(t_kto) == 3 * nograd(t_apo)  # 1 + 2 KL forwards vs the reference's 1
    assert t_kto["flops_per_step"] - t_apo["flops_per_step"] == 2 * nograd(t_apo)
    terms = {n: {t["name"]: t["seconds"] for t in d["step_time"]["terms"]} for n, d in (("kto", t_kto), ("apo", t_apo))}
    assert terms["kto"]["kto forwards without gradients"] == pytest.approx(3 * terms["apo"]["kto forwards without gradients"], rel=1e-9)
    assert set(terms["kto"]) == set(terms["apo"])
    for name in terms["kto"]:
        if name != "kto forwards without gradients":
            assert terms["kto"][name] == pytest.approx(terms["apo"][name], rel=1e-9), name
    assert "KL sequence" in " ".join(t_kto["notes"]) and "KL sequence" not in " ".join(t_apo["notes"])
    assert "1 through the reference" in " ".join(t_apo["notes"]) and "2 through the reference" in " ".join(t_kto["notes"])
    # memory: the KL forward runs without gradients before the policy's and is not at the peak (the trace agrees:
    # tests/apply/test_preference_memory.py); the same parts either way
    assert kto.memory.to_dict()["components"] == apo.memory.to_dict()["components"]


def test_kto_reads_pairs_as_trl_unpairs_them_and_refuses_a_split_that_mixes_both(tmp_path):
    """KTO on prompt / chosen / rejected rows: TRL unpairs a split whose first row is a pair
    (trl/trainer/kto_trainer.py _prepare_dataset), so the plan checks such a split as pairs, says it
    trains 2N completions, and says how the rows are ordered; an unpaired row in it has no chosen / rejected."""
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs(6))
    plan = plan_file(_kto(tmp_path, gpu="A100-80GB", data=f'train_files = ["{data}"]'), environment=ENV)
    notes = [d.summary for d in plan.diagnostics if d.severity == "note"]
    assert any(f"6 rows in {data} are prompt / chosen / rejected pairs" in n and "12 labelled completions" in n for n in notes)
    assert any("shuffled once with training.seed = " in n for n in notes)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [*pairs(2), {"prompt": "a ->", "completion": " a.", "label": True}])
    with pytest.raises(PlanError) as e:
        plan_file(_kto(tmp_path, gpu="A100-80GB", data=f'train_files = ["{mixed}"]'), environment=ENV)
    (d,) = _errors(e)
    assert "1 of 3 kto rows" in d.summary and "has no chosen / rejected (rows 2)" in d.summary
    assert "row 0 makes this a split of pairs" in d.fix
    apo = plan_file(_kto(tmp_path, gpu="A100-80GB", loss='loss_type = "apo_zero_unpaired"'), environment=ENV)
    assert any("sampled at random with training.seed" in d.summary for d in apo.diagnostics if d.severity == "note")


def _expected_longest(lengths: list[int], b: int):
    """E[the longest of b rows drawn without replacement], exactly: P(longest <= l_(i)) = C(i, b) / C(n, b)."""
    from fractions import Fraction

    ls, n = sorted(lengths), len(lengths)
    return sum(Fraction(length * (math.comb(i, b) - math.comb(i - 1, b)), math.comb(n, b)) for i, length in enumerate(ls, start=1))


def _rows_of(n_bytes: list[tuple[int, int, int]]) -> list[dict[str, str]]:
    """prompt / chosen / rejected rows of the given byte lengths (plain ASCII)."""
    return [{"prompt": "p" * a, "chosen": "c" * b, "rejected": "r" * c} for a, b, c in n_bytes]


def test_dpo_time_prices_the_batch_padded_to_its_longest_pair_not_seq_len(tmp_path):
    """TRL pads a DPO micro-batch to its longest sequence, each capped at max_length (trl/trainer/dpo_trainer.py
    DataCollatorForPreference, trl/trainer/utils.py pad): over short rows the step carries fewer tokens than
    seq_len and takes less time; the memory stays priced at full length. No tokenizer.json: 4 bytes per token."""
    short = _rows_of([(40 + 12 * i, 20 + 4 * i, 60 + (8 * i) % 90) for i in range(48)])
    long = _rows_of([(100, 9000, 60)] * 8) + short[8:]  # 8 rows whose chosen runs past max_length = 2048 tokens: capped
    batch = "per_device_train_batch_size = 4\ngradient_accumulation_steps = 16\n"
    plans = {}
    for name, rows in (("short", short), ("long", long), ("full", _rows_of([(100, 9000, 60)] * 48))):
        data = f'train_files = ["{write_jsonl(tmp_path / f"{name}.jsonl", rows)}"]\n'
        (tmp_path / name).mkdir()
        plans[name] = plan_file(_dpo(tmp_path / name, data=data, extra=batch), environment=ENV)
    full = plans["full"].throughput
    assert full.tokens_per_step == 64 * 2 * 2048  # every batch holds a row at max_length: full length
    for name, rows in (("short", short), ("long", long)):
        plan = plans[name]
        # an example's longest sequence: max(prompt + chosen, prompt + rejected) at 4 bytes per token, + the EOS
        # TRL appends to each answer (dpo_trainer.py add_eos), capped at max_length
        lengths = [max(min((len(r["prompt"]) + len(r[a])) // 4 + 1, 2048) for a in ("chosen", "rejected")) for r in rows]
        padded = math.ceil(_expected_longest(lengths, 4))
        assert padded < 2048
        t = plan.throughput
        assert t.tokens_per_step == 64 * 2 * padded  # 4 examples x 16 micro-batches, 2 sequences each
        assert t.step_time_s < full.step_time_s
        assert f"expected {padded} of 2048 tokens" in t.assumption and f"the 48 rows of {name}.jsonl" in t.assumption
        assert "memory is priced at the full 2048" in t.assumption
        # only the time changes: the same memory as the full-length rows
        assert plan.memory.allocated_peak_bytes == plans["full"].memory.allocated_peak_bytes
        assert plan.memory.components == plans["full"].memory.components and plan.memory.workload.seq_len == 2048
    assert plans["short"].throughput.step_time_s < plans["long"].throughput.step_time_s
    assert padded > 1000  # long: its 8 capped rows make a batch's longest 2048 often
    # the time is that of a plan whose sequences are `padded` long (seq_len = padded, rows at full length)
    # under the same memory savers (the full-length memory needs gradient checkpointing)
    assert plans["short"].memory.workload.gradient_checkpointing
    padded_short = plans["short"].throughput.tokens_per_step // 128
    (tmp_path / "at").mkdir()
    pinned = batch + "gradient_checkpointing = true\n"
    at = _dpo(tmp_path / "at", data=f'train_files = ["{tmp_path / "full.jsonl"}"]\n', extra=pinned)
    at.write_text(at.read_text().replace("seq_len = 2048", f"seq_len = {padded_short}"))
    same = plan_file(at, environment=ENV).throughput
    assert same.tokens_per_step == plans["short"].throughput.tokens_per_step
    assert plans["short"].throughput.step_time_s == pytest.approx(same.step_time_s, rel=1e-9)
    assert "padded" not in same.assumption  # rows at that max_length: nothing to say


def test_kto_time_prices_the_batch_padded_to_its_longest_completion(tmp_path):
    """KTO's collator pads prompt + completion to the micro-batch's longest, capped at max_length
    (trl/trainer/kto_trainer.py DataCollatorForUnpairedPreference): one sequence per example."""
    rows = [{"prompt": "p" * (30 + 7 * i), "completion": "c" * (10 + 5 * i), "label": i % 2 == 0} for i in range(40)]
    data = f'train_files = ["{write_jsonl(tmp_path / "kto.jsonl", rows)}"]\n'
    path = _kto(tmp_path, gpu="A100-80GB", extra="per_device_train_batch_size = 4\ngradient_accumulation_steps = 16\n")
    path.write_text(path.read_text().replace("seq_len = 2048\n", "seq_len = 2048\n" + data))
    t = plan_file(path, environment=ENV).throughput
    padded = math.ceil(_expected_longest([min((len(r["prompt"]) + len(r["completion"])) // 4 + 1, 2048) for r in rows], 4))
    assert t.tokens_per_step == 64 * padded and "kto sequences padded to the longest of each micro-batch of 4" in t.assumption
