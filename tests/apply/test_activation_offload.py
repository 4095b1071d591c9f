"""Activation offloading for real (apply/model/activation_offload.py): the saved tensors go to host memory
and come back for backward, parameters stay where they are, gradients and a Trainer run's losses are
unchanged; the plan prices it in host RAM and host-link time and refuses it where it cannot help."""

from __future__ import annotations

import copy

import pytest
import torch

from gpuplan.apply.model.activation_offload import Offloader, install
from gpuplan.plan.types import PlanError
from tests.helpers.apply_plans import MICRO_LLAMA, cpu_plan, write_config
from tests.helpers.library_patches import transformers_globals_restored
from tests.helpers.planning import SPECS, plan_text

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


def _micro_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{k: v for k, v in MICRO_LLAMA.items() if k != "model_type"}))


def test_offloaded_forward_keeps_the_gradients_and_moves_no_parameter():
    plain = _micro_llama()
    off = copy.deepcopy(plain)
    hooks = install(off, min_bytes=1)
    x = torch.randint(0, 256, (2, 24))
    plain(input_ids=x, labels=x).loss.backward()
    off(input_ids=x, labels=x).loss.backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), off.parameters()))
    params = sum(p.numel() * p.element_size() for p in off.parameters())
    assert 0 < hooks.moved and hooks.moved < 50 * params  # activations moved, not the weights each step


def test_pack_leaves_parameters_and_small_tensors_and_unpack_restores_the_rest():
    hooks = Offloader(min_bytes=1024)
    w = torch.nn.Parameter(torch.ones(512, 512))
    assert hooks.pack(w) is w and hooks.pack(torch.ones(8)).numel() == 8 and hooks.moved == 0
    t = torch.arange(1024.0).reshape(32, 32).t()  # a non-contiguous view
    packed = hooks.pack(t)
    assert isinstance(packed, tuple) and hooks.moved == 4096
    assert torch.equal(Offloader.unpack(packed), t)


@pytest.mark.slow
def test_trainer_run_with_offloading_matches_the_standard_run(tmp_path):
    from gpuplan.apply.train.execute import build_trainer

    # an MLP of 2,048: its activations (8 x 64 tokens x 2,048 x 4 bytes = 4 MiB) pass the 1 MiB floor
    config = write_config(tmp_path, dict(MICRO_LLAMA, intermediate_size=2048), "wide.json")

    def losses(name, **over):
        (tmp_path / name).mkdir()
        plan = cpu_plan(
            tmp_path / name,
            **{
                "training.max_steps": 3,
                "training.logging_steps": 1,
                "model.config": config,
                "output.dir": str(tmp_path / name / "run"),
                **over,
            },
        )
        prepared = build_trainer(plan, progress=False)
        prepared.trainer.train()
        return prepared, [r["loss"] for r in prepared.trainer.state.log_history if "loss" in r]

    _, standard = losses("standard")
    prepared, offloaded = losses("offloaded", **{"training.activation_offloading": True})
    assert prepared.model._gpuplan_offloader.moved > 0  # the hooks ran in the Trainer's forward
    assert offloaded == pytest.approx(standard, rel=1e-6)


QLORA = (SPECS / "llama-8b-qlora-4090.toml").read_text().replace('"models/', f'"{SPECS}/models/').replace('"data/', f'"{SPECS}/data/')


def _plan(tmp_path, gpu="RTX-4090", extra="activation_offloading = true"):
    return plan_text(
        tmp_path, QLORA.replace('gpu = "RTX-4090"', f'gpu = "{gpu}"').replace("warmup_ratio = 0.03", "warmup_ratio = 0.03\n" + extra)
    )


def test_plan_counts_host_ram_and_host_link_time(tmp_path):
    plan = _plan(tmp_path)
    assert plan.value("training.gradient_checkpointing") is False
    assert "activation offloading keeps the activations in host RAM" in plan.settings["training.gradient_checkpointing"].reason
    moved = plan.memory.host_bytes
    assert moved > 10 * 2**30
    # out and back over the 4090's 32 GB/s PCIe 4.0 x16 (catalog) at the 75% pinned copies reach, every micro-batch
    accumulation = plan.value("training.gradient_accumulation_steps")
    assert plan.throughput.saver_seconds["activation offloading"] == pytest.approx(2 * moved * accumulation / (0.75 * 32e9))
    note = next(d for d in plan.diagnostics if d.key == "training.activation_offloading")
    assert "pinned host RAM per GPU" in note.summary and "32 GB/s host link" in note.summary


@pytest.mark.parametrize(
    "gpu, extra, why",
    [
        ("cpu", "activation_offloading = true", "already live in host RAM"),
        ("RTX-4090", "activation_offloading = true\ngradient_checkpointing = true", "checkpoint holds itself"),
    ],
)
def test_plan_refuses_offloading_where_it_cannot_help(tmp_path, gpu, extra, why):
    with pytest.raises(PlanError) as e:
        _plan(tmp_path, gpu, extra)
    err = next(d for d in e.value.diagnostics if d.key == "training.activation_offloading")
    assert why in err.summary and err.fix.startswith("set training.activation_offloading = false")


@pytest.fixture
def liger_undone():
    """Liger patches transformers' modules for the whole process; later tests in this worker
    must build the plain Llama their plan asked for."""
    with transformers_globals_restored():
        yield


def test_liger_replacing_the_forward_keeps_the_activations_offloaded(liger_undone):
    # issue 30 item 6: Trainer.train() applies Liger after the model is built (transformers trainer.py:
    # apply_liger_kernel at the top of train()), and Liger's instance patch sets model.forward =
    # MethodType(lce_forward, model) (liger_kernel/transformers/monkey_patch.py), dropping the offload
    # wrapper. The real patch is applied here, without the kernels a CPU cannot run (Triton RMSNorm,
    # RoPE, SwiGLU); its lce_forward computes the logits in torch when there are no labels.
    from liger_kernel.transformers.model.llama import lce_forward
    from transformers.integrations.liger import apply_liger_kernel

    from gpuplan.apply.model.activation_offload import installed, keep_installed

    model = _micro_llama()
    hooks = install(model, min_bytes=1)
    apply_liger_kernel(model, {"rope": False, "rms_norm": False, "swiglu": False})
    assert model.forward.__func__ is lce_forward and not installed(model)  # Liger's patch dropped the wrapper
    assert keep_installed(model) and installed(model) and not keep_installed(model)  # re-wrapped once
    assert model.forward.__wrapped__.__func__ is lce_forward  # Liger's forward, inside the offload hooks
    x = torch.randint(0, 256, (2, 24))
    model(input_ids=x).logits.float().sum().backward()
    assert hooks.moved > 0  # the saved tensors of Liger's forward went to host memory


@pytest.mark.slow
def test_the_trainer_runs_liger_inside_the_offload_hooks(tmp_path, liger_undone):
    # the order as Trainer.train() runs it: apply_liger_kernel, then on_train_begin (gpuplan re-wraps), then
    # the first step; the run is stopped before it, where Liger's Triton kernels would need a GPU
    from liger_kernel.transformers.model.llama import lce_forward
    from transformers import TrainerCallback

    from gpuplan.apply.model.activation_offload import installed
    from gpuplan.apply.train.execute import build_trainer

    class Stop(Exception):
        pass

    seen = {}

    class BeforeTheFirstStep(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):  # the Trainer's live model
            seen["offloaded"] = installed(model)
            seen["liger"] = getattr(getattr(model.forward, "__wrapped__", model.forward), "__func__", None) is lce_forward
            raise Stop

    plan = cpu_plan(
        tmp_path,
        **{
            "training.max_steps": 1,
            "training.activation_offloading": True,
            "training.use_liger_kernel": True,
            "output.dir": str(tmp_path / "run"),
        },
    )
    prepared = build_trainer(plan, progress=False, extra_callbacks=[BeforeTheFirstStep()])
    assert installed(prepared.model) and prepared.trainer.args.use_liger_kernel
    with pytest.raises(Stop):
        prepared.trainer.train()
    assert seen == {"offloaded": True, "liger": True}


def test_liger_patches_are_undone_for_the_tests_that_follow():
    # Liger's default kernels swap modeling_llama's RMSNorm, MLP and RoPE for the whole process; a
    # later Llama built in this worker must be transformers' own, or its audit reports Liger live
    from transformers.integrations.liger import apply_liger_kernel
    from transformers.models.llama import modeling_llama

    from gpuplan.apply.train.audit import _liger

    plain = (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP, modeling_llama.apply_rotary_pos_emb)
    with transformers_globals_restored():
        apply_liger_kernel(_micro_llama(), {})
        assert modeling_llama.LlamaRMSNorm is not plain[0] and _liger(_micro_llama())
    assert (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP, modeling_llama.apply_rotary_pos_emb) == plain
    assert not _liger(_micro_llama())
