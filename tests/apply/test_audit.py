"""The audit (gpuplan/apply/train/audit.py): every audited setting, made to differ in the live run, stops the
run before step 1 with an error naming the key, the planned and the live value.

Each test plans a real spec (tests/helpers/plan_apply.py) on a randomly initialised tiny Llama, builds
the real Trainer (TRL's for dpo) with build_trainer(), and changes a live object: before train() (the
Trainer builds its DataLoader and turns checkpointing on from what it holds then), or in a callback
put ahead of the audit's own at on_train_begin (the optimizer and scheduler exist only from there).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from gpuplan.apply.train import audit  # noqa: E402
from gpuplan.apply.train.execute import build_trainer  # noqa: E402
from tests.helpers.plan_apply import SFT, plan_case, random_base  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return random_base(tmp_path_factory.mktemp("audit-base"))


def _plan(tmp_path, base, max_steps=4, **case):
    return plan_case(dataclasses.replace(SFT, **case), tmp_path, base, max_steps=max_steps)


def _build(plan):
    return build_trainer(plan, progress=False)


class _AtTrainBegin(TrainerCallback):
    def __init__(self, change: Callable[[Any], None]):
        self.change, self.trainer = change, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.change(self.trainer)


def _refused(prepared, key: str, *, before: Callable[[Any], None] | None = None, at_begin: Callable[[Any], None] | None = None):
    """Train with the change made; the audit must stop it before the first optimizer step."""
    trainer = prepared.trainer
    if before is not None:
        before(trainer)
    if at_begin is not None:
        cb = _AtTrainBegin(at_begin)
        cb.trainer = trainer
        # just ahead of the audit's callback: after gpuplan's own (keep_offload re-wraps a replaced forward)
        callbacks = trainer.callback_handler.callbacks
        at = next(i for i, c in enumerate(callbacks) if type(c).__name__ == "AuditCallback")
        callbacks.insert(at, cb)
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    with pytest.raises(audit.AuditError) as e:
        trainer.train()
    msg = e.value.message
    assert msg.startswith("gpuplan bug: the live run differs from its plan (train-begin"), msg
    assert f"{key}: planned " in msg and ", live " in msg, msg
    assert trainer.state.global_step == 0
    live = dict(trainer.model.named_parameters())
    assert all(torch.equal(w, live[n].detach()) for n, w in weights.items() if n in live)  # no step taken
    differed = [c.key for _, c in prepared.audit.differences]
    assert key in differed, differed
    return msg


def _opt(trainer):
    return audit._unwrap_optimizer(trainer.optimizer)


def _base_of(trainer):
    return audit._base(trainer.model)


# ---- what a clean build records --------------------------------------------------------------------


def test_a_clean_build_passes_and_records_both_stages(tmp_path, base):
    prepared = _build(_plan(tmp_path, base, method="lora"))
    assert list(prepared.audit.stages) == ["build"] and not prepared.audit.differences
    prepared.trainer.train()
    record = prepared.audit.to_dict()
    assert record["stages"] == ["build", "train-begin"] and record["differed"] == []
    keys = {c["key"] for c in record["checked"]["train-begin"]}
    assert {
        "model.trainable_params",
        "model.trainable_dtype",
        "model.dtype",
        "lora.lora_dropout",
        "training.optim",
        "training.learning_rate",
        "training.adam_betas",
        "training.weight_decay",
        "optimizer.param_groups",
        "training.lr_scheduler_type",
        "training.per_device_train_batch_size",
        "training.gradient_accumulation_steps",
        "hardware.world_size",
        "training.gradient_checkpointing",
        "model.attn_implementation",
        "model.forward_wrappers",
        "training.autocast",
        "distributed.strategy",
        "data.packing",
        "data.collator",
        "tokenizer.special_tokens",
    } <= keys


# ---- what is trained ---------------------------------------------------------------------------------


def test_a_frozen_parameter_changes_the_trainable_count(tmp_path, base):
    prepared = _build(_plan(tmp_path, base))
    _refused(prepared, "model.trainable_params", before=lambda t: _base_of(t).model.embed_tokens.weight.requires_grad_(False))


def test_adapters_cast_to_bf16_are_caught(tmp_path, base):
    """What TRL does to the adapters on a quantized base (issue 30 defect 1)."""

    def cast(t):
        for n, p in t.model.named_parameters():
            if "lora_A" in n:
                p.data = p.data.to(torch.bfloat16)

    _refused(_build(_plan(tmp_path, base, method="lora")), "model.trainable_dtype", before=cast)


def test_a_frozen_base_in_another_dtype_is_caught(tmp_path, base):
    def cast(t):
        layer = _base_of(t).model.layers[0].self_attn.q_proj.base_layer
        layer.weight.data = layer.weight.data.to(torch.bfloat16)

    _refused(_build(_plan(tmp_path, base, method="lora")), "model.dtype", before=cast)


def test_adapter_dropout_turned_off_is_caught(tmp_path, base):
    """What TRL's disable_dropout does (issue 30 defect 2)."""

    def off(t):
        for m in t.model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0

    _refused(_build(_plan(tmp_path, base, method="lora", lora_dropout=0.1)), "lora.lora_dropout", before=off)


def test_dora_switched_on_is_caught(tmp_path, base):
    def dora(t):
        for m in t.model.modules():
            if isinstance(getattr(m, "use_dora", None), dict):
                m.use_dora["default"] = True

    _refused(_build(_plan(tmp_path, base, method="lora")), "lora.use_dora", before=dora)


@pytest.fixture(scope="module")
def qlora_plan(tmp_path_factory, base):
    return _plan(tmp_path_factory.mktemp("qlora"), base, method="qlora")


def _four_bit(t):
    return audit._four_bit(t.model)


def test_another_4bit_quant_type_is_caught(qlora_plan):
    def fp4(t):
        _four_bit(t)[0].weight.quant_state.quant_type = "fp4"  # what dequantize_4bit reads

    _refused(_build(qlora_plan), "quantization.bnb_4bit_quant_type", before=fp4)


def test_another_4bit_compute_dtype_is_caught(qlora_plan):
    planned = qlora_plan.value("quantization.bnb_4bit_compute_dtype")
    other = torch.float16 if planned != "float16" else torch.bfloat16

    def change(t):
        _four_bit(t)[0].compute_dtype = other

    _refused(_build(qlora_plan), "quantization.bnb_4bit_compute_dtype", before=change)


def test_single_quantization_is_caught(qlora_plan):
    assert qlora_plan.value("quantization.bnb_4bit_use_double_quant") is True

    def single(t):
        _four_bit(t)[0].weight.quant_state.nested = False

    _refused(_build(qlora_plan), "quantization.bnb_4bit_use_double_quant", before=single)


def test_a_base_left_unquantized_is_caught(tmp_path, base):
    """A QLoRA plan whose base loaded in 16/32 bits: the 4-bit layers are not there."""

    def unquantize(t):
        for name, m in list(t.model.named_modules()):
            if type(m).__name__ == "Linear4bit" and type(m).__module__.startswith("bitsandbytes"):
                parent = t.model.get_submodule(name.rsplit(".", 1)[0])
                plain = torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
                plain.requires_grad_(False)
                setattr(parent, name.rsplit(".", 1)[1], plain)

    _refused(_build(_plan(tmp_path, base, method="qlora")), "quantization.4bit_layers", before=unquantize)


def test_another_attention_implementation_is_caught(tmp_path, base):
    def eager(t):
        _base_of(t).config._attn_implementation = "eager"

    _refused(_build(_plan(tmp_path, base)), "model.attn_implementation", before=eager)


# ---- the batch -------------------------------------------------------------------------------------


def test_another_per_device_batch_is_caught(tmp_path, base):
    plan = _plan(tmp_path, base)
    assert plan.value("training.per_device_train_batch_size") == 4

    def batch(t):
        t._train_batch_size = 2  # the DataLoader is built from it (trainer.py get_train_dataloader)

    _refused(_build(plan), "training.per_device_train_batch_size", before=batch)


def test_another_accumulation_is_caught(tmp_path, base):
    def accumulate(t):
        t.args.gradient_accumulation_steps = 2

    _refused(_build(_plan(tmp_path, base)), "training.gradient_accumulation_steps", before=accumulate)


def test_a_world_size_the_process_does_not_have_is_caught(tmp_path, base):
    """A plan for 2 processes audited against a run of one (TrainingArguments itself refuses a 2-process
    plan outside torchrun, so the live side is a real 1-process Trainer): one rank would train half the batch."""
    plan = _plan(tmp_path, base)
    prepared = _build(plan)
    two = dataclasses.replace(
        plan, settings={**plan.settings, "hardware.count": dataclasses.replace(plan.settings["hardware.count"], value=2)}
    )
    with pytest.raises(audit.AuditError, match=r"hardware.world_size: planned 2, live 1"):
        audit.audit(two, prepared.trainer, audit.BUILD, audit.AuditLog())


def test_mixed_precision_switched_on_is_caught(tmp_path, base):
    prepared = _build(_plan(tmp_path, base))
    state = prepared.trainer.accelerator.state
    before = state._mixed_precision
    try:
        _refused(prepared, "training.autocast", at_begin=lambda t: setattr(state, "_mixed_precision", "bf16"))
    finally:
        state._mixed_precision = before  # accelerate's state is shared by every Accelerator in the process


# ---- forward wrappers ----------------------------------------------------------------------------------


def _replace_forward(t):
    """What Liger does (liger_kernel transformers/monkey_patch.py): a new bound forward on the model."""
    lm = _base_of(t)
    lm.forward = types.MethodType(type(lm).forward, lm)


def test_a_replaced_forward_drops_the_chunked_loss(tmp_path, base):
    prepared = _build(_plan(tmp_path, base, loss_chunk_size=16))
    assert audit._forward_wrappers(prepared.trainer.model) == ["loss_chunk"]
    _refused(prepared, "model.forward_wrappers", at_begin=_replace_forward)


def test_the_chunked_loss_inside_accelerates_autocast_wrapper_passes(tmp_path, base):
    """Under mixed precision accelerate wraps the forward in autocast (accelerator.py prepare_model) and still
    calls the chunked loss inside: in place, not replaced (the fuzz found the audit stopping such a run)."""
    plan = _plan(tmp_path, base, max_steps=1, loss_chunk_size=16, precision="bf16-amp")
    assert plan.value("training.bf16") is True
    prepared = _build(plan)
    prepared.trainer.train()
    assert prepared.trainer.state.global_step == 1 and not prepared.audit.differences
    begin = {c.key: c for c in prepared.audit.stages["train-begin"]}
    assert begin["training.autocast"].live == "bf16" and begin["model.forward_wrappers"].live == ["loss_chunk"]
    assert len(audit._forward_chain(prepared.trainer.model)) > 1  # accelerate's wrapper around gpuplan's


def test_another_chunk_size_is_caught(tmp_path, base):
    from gpuplan.apply.model.chunked_loss import install

    def rechunk(t):
        _replace_forward(t)
        install(_base_of(t), 8)

    _refused(_build(_plan(tmp_path, base, loss_chunk_size=16)), "training.loss_chunk_size", at_begin=rechunk)


def test_a_replaced_forward_drops_the_activation_offload(tmp_path):
    """The CPU planner refuses offloading (activations already live in host RAM), so a hand-built plan."""
    from tests.helpers.apply_plans import cpu_plan

    plan = cpu_plan(tmp_path, **{"training.activation_offloading": True, "training.max_steps": 2, "data.seq_len": 32})
    prepared = _build(plan)
    assert audit._forward_wrappers(prepared.trainer.model) == ["activation_offload"]
    _refused(prepared, "model.forward_wrappers", at_begin=_replace_forward)


_LIGER = """
import sys, types
from pathlib import Path
from gpuplan.apply.train import audit
from gpuplan.apply.train.execute import build_trainer
from gpuplan.plan.types import Plan
import json
plan = Plan.from_dict(json.loads(Path(sys.argv[1]).read_text()))
trainer = build_trainer(plan, progress=False).trainer
trainer.args.use_liger_kernel = True  # Trainer.train() applies Liger to the live model (trainer.py train)
try:
    trainer.train()
except audit.AuditError as e:
    print(e.message)
    sys.exit(3)
"""


def test_liger_kernels_the_plan_did_not_ask_for_are_caught(tmp_path, base):
    """In a process of its own (forked from the worker's server: tests/helpers/forked.py python_file): Liger's
    instance patch also swaps transformers' module-level classes (liger_kernel/transformers/monkey_patch.py),
    which would leak into every later test."""
    import json
    import subprocess

    pytest.importorskip("liger_kernel")
    from tests.helpers.apply_plans import REPO
    from tests.helpers.cli_runs import env
    from tests.helpers.forked import python_file

    plan_json = tmp_path / "plan.json"
    plan_json.write_text(json.dumps(_plan(tmp_path, base).to_dict()))
    probe = tmp_path / "liger_probe.py"
    probe.write_text(_LIGER)
    with python_file(probe, [plan_json], env=env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-3000:]
    assert "(train-begin" in out and "training.use_liger_kernel: planned False, live True" in out, out


# ---- checkpointing -------------------------------------------------------------------------------------


def test_checkpointing_turned_off_is_caught(tmp_path, base):
    plan = _plan(tmp_path, base, gradient_checkpointing=True)
    _refused(_build(plan), "training.gradient_checkpointing", at_begin=lambda t: t.model.gradient_checkpointing_disable())


def test_reentrant_checkpointing_is_caught(tmp_path, base):
    plan = _plan(tmp_path, base, gradient_checkpointing=True)

    def reentrant(t):
        t.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})

    _refused(_build(plan), "training.gradient_checkpointing_reentrant", at_begin=reentrant)


# ---- optimizer and scheduler ------------------------------------------------------------------------------


def test_another_optimizer_class_is_caught(tmp_path, base):
    def sgd(t):
        t.optimizer = torch.optim.SGD([p for p in t.model.parameters() if p.requires_grad], lr=t.args.learning_rate)
        t.lr_scheduler.optimizer = t.optimizer

    _refused(_build(_plan(tmp_path, base)), "training.optim", at_begin=sgd)


def test_another_learning_rate_is_caught(tmp_path, base):
    def lr(t):
        t.lr_scheduler.base_lrs = [x * 50 for x in t.lr_scheduler.base_lrs]  # every step's lr = base_lr x lambda

    _refused(_build(_plan(tmp_path, base)), "training.learning_rate", at_begin=lr)


def test_other_betas_are_caught(tmp_path, base):
    def betas(t):
        for g in _opt(t).param_groups:
            g["betas"] = (0.8, 0.95)

    _refused(_build(_plan(tmp_path, base)), "training.adam_betas", at_begin=betas)


def test_another_weight_decay_is_caught(tmp_path, base):
    def decay(t):
        for g in _opt(t).param_groups:
            g["weight_decay"] = 0.5

    _refused(_build(_plan(tmp_path, base)), "training.weight_decay", at_begin=decay)


def test_a_parameter_missing_from_the_optimizer_is_caught(tmp_path, base):
    def drop(t):
        group = _opt(t).param_groups[0]
        group["params"] = group["params"][1:]

    _refused(_build(_plan(tmp_path, base)), "optimizer.param_groups", at_begin=drop)


def test_another_schedule_is_caught(tmp_path, base):
    plan = _plan(tmp_path, base)
    assert plan.value("training.lr_scheduler_type") == "linear"

    def constant(t):
        t.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(_opt(t), lambda step: 1.0)

    _refused(_build(plan), "training.lr_scheduler_type", at_begin=constant)


def test_a_data_parallel_wrapper_the_plan_did_not_ask_for_is_caught(tmp_path, base):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    prepared = _build(_plan(tmp_path, base))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _refused(prepared, "distributed.strategy", at_begin=lambda t: setattr(t, "model_wrapped", DistributedDataParallel(t.model)))
    finally:
        dist.destroy_process_group()


# ---- data and tokenizer -------------------------------------------------------------------------------------


def test_another_collator_is_caught(tmp_path, base):
    from transformers import default_data_collator

    _refused(_build(_plan(tmp_path, base)), "data.collator", before=lambda t: setattr(t, "data_collator", default_data_collator))


def test_unpacked_examples_are_caught(tmp_path, base):
    plan = _plan(tmp_path, base)
    assert plan.value("data.packing") is True

    def unpack(t):
        t.train_dataset = t.train_dataset.map(lambda row: {"attention_mask": [1] * len(row["input_ids"])})

    _refused(_build(plan), "data.packing", before=unpack)


def test_a_changed_pad_token_is_caught(tmp_path, base):
    def pad(t):
        t.processing_class.pad_token = t.processing_class.eos_token

    _refused(_build(_plan(tmp_path, base)), "tokenizer.special_tokens", before=pad)


# ---- the objective and the reference ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dpo_full(tmp_path_factory, base):
    return _plan(tmp_path_factory.mktemp("dpo-full"), base, objective="dpo", data="preference")


def test_another_beta_is_caught(dpo_full):
    _refused(_build(dpo_full), "preference.beta", before=lambda t: setattr(t, "beta", 0.5))


def test_another_loss_type_is_caught(dpo_full):
    _refused(_build(dpo_full), "preference.loss_type", before=lambda t: setattr(t, "loss_types", ["hinge"]))


def test_a_missing_reference_copy_is_caught(dpo_full):
    assert dpo_full.value("preference.reference") == "copy"
    _refused(_build(dpo_full), "preference.reference", before=lambda t: setattr(t, "ref_model", None))


def test_a_reference_in_another_dtype_is_caught(dpo_full):
    """issue 30 defect 4 is the other way round (a bf16 copy of an fp32 policy) on GPUs with bf16."""
    _refused(_build(dpo_full), "preference.reference_dtype", before=lambda t: t.ref_model.to(torch.bfloat16))


def test_a_full_dpo_reference_copy_under_bf16_autocast_is_read_in_the_policys_fp32(tmp_path, base):
    """The plan prices a full fine-tune's reference copy in the policy's dtype (memory/preference.py
    reference_element_bytes, as trl/trainer/dpo_trainer.py builds it); the audit read it against the
    compute dtype and stopped a correct run at build (found by benchmarks/plan_apply_fuzz.py, seed 0)."""
    plan = _plan(tmp_path, base, objective="dpo", data="preference", precision="bf16-amp")
    assert plan.value("preference.reference") == "copy" and plan.value("training.bf16")
    prepared = _build(plan)  # the build-stage audit raises on a difference
    assert {p.dtype for p in prepared.trainer.ref_model.parameters()} == {torch.float32}
    assert not prepared.audit.differences


def test_a_reference_that_trains_is_caught(dpo_full):
    _refused(_build(dpo_full), "preference.reference_frozen", before=lambda t: t.ref_model.requires_grad_(True))


def test_a_separate_reference_instead_of_adapters_off_is_caught(tmp_path, base):
    plan = _plan(tmp_path, base, objective="dpo", data="preference", method="lora")
    assert plan.value("preference.reference") == "adapters-off"

    def separate(t):
        t.ref_model = copy.deepcopy(audit._base(t.model)).requires_grad_(False)

    _refused(_build(plan), "preference.reference", before=separate)


def test_a_trainer_for_another_objective_is_caught(tmp_path, base, dpo_full):
    """The SFT plan's Trainer handed to a DPO plan's audit: the objective's trainer class differs."""
    sft = _build(_plan(tmp_path, base))
    with pytest.raises(audit.AuditError, match=r"training.objective: planned 'DPOTrainer', live 'Trainer'"):
        audit.audit(dpo_full, sft.trainer, audit.BUILD, audit.AuditLog())


def test_a_trl_trainer_on_an_sft_plan_is_caught(tmp_path, base):
    """The live trainer is TRL's SFTTrainer, not the plan's transformers Trainer: told apart by its classes'
    module, which asks nothing of TRL's GRPO / RLOO modules (their import loads mlflow)."""
    import trl

    plan = _plan(tmp_path, base)
    built = _build(plan)
    built.trainer.__class__ = trl.SFTTrainer  # TRL's own class on the same live object
    with pytest.raises(audit.AuditError, match=r"training.objective: planned 'Trainer', live 'SFTTrainer'"):
        audit.audit(plan, built.trainer, audit.BUILD, audit.AuditLog())


def test_a_kto_run_that_samples_its_rows_at_random_is_caught(tmp_path, base):
    """KTO with a KL term reads its (seeded, shuffled) rows in order, as TRL's KTOTrainer requires
    (trl/trainer/kto_config.py train_sampling_strategy; apply/train/preference.py train_sampling): recorded at
    both stages, and a random sampler in the live DataLoader stops the run."""
    plan = _plan(tmp_path, base, objective="kto", data="preference")
    prepared = _build(plan)
    (check,) = [c for c in prepared.audit.stages["build"] if c.key == "data.train_sampler"]
    assert check.planned == check.live == "sequential"
    _refused(prepared, "data.train_sampler", before=lambda t: setattr(t.args, "train_sampling_strategy", "random"))
