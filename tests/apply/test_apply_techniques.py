"""Each technique of the guide reaches the live objects of a real Trainer run on CPU.

Every test builds the Trainer from a hand-made Plan (apply/run.build_trainer) and looks
at what transformers actually holds or does: the optimizer class and its state, the
model's attention implementation, checkpointing flags and recomputation, autocast
dtypes, DataLoader settings, cache clearing, the compiled module.
"""

from __future__ import annotations

import pytest
import torch

from gpuplan.apply.train.execute import build_trainer
from tests.helpers.apply_plans import H100_PROFILE, MICRO_LLAMA, cpu_plan, write_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _train(tmp_path, steps=2, **overrides):
    prepared = build_trainer(cpu_plan(tmp_path, **{"training.max_steps": steps, **overrides}), progress=False)
    prepared.trainer.train()
    return prepared


def test_adamw_bnb_8bit_is_bitsandbytes_8bit_adamw_with_8bit_state(tmp_path):
    bnb = pytest.importorskip("bitsandbytes")
    # bitsandbytes keeps tensors under 4096 elements in 32-bit (and transformers keeps embeddings
    # in 32-bit): widen the MLP to 32 x 160 = 5120 elements so its weights get 8-bit states.
    config = write_config(tmp_path, dict(MICRO_LLAMA, intermediate_size=160), "wide.json")
    prepared = _train(tmp_path, **{"training.optim": "adamw_bnb_8bit", "model.config": config})
    opt = prepared.trainer.optimizer
    inner = getattr(opt, "optimizer", opt)  # accelerate wraps it in AcceleratedOptimizer
    # transformers builds bnb.optim.AdamW(optim_bits=8), the class AdamW8bit specialises
    assert isinstance(inner, bnb.optim.AdamW) and inner.args.optim_bits == 8
    dtypes = {v.dtype for s in inner.state.values() for k, v in s.items() if k in ("state1", "state2")}
    assert torch.uint8 in dtypes  # the moments really are stored in 8 bits


def test_create_optimizer_gives_the_planned_class(tmp_path):
    from transformers.optimization import Adafactor

    prepared = build_trainer(cpu_plan(tmp_path, **{"training.optim": "adafactor"}), progress=False)
    assert isinstance(prepared.trainer.create_optimizer(), Adafactor)

    prepared = build_trainer(cpu_plan(tmp_path, **{"training.optim": "adamw_torch_fused"}), progress=False)
    opt = prepared.trainer.create_optimizer()
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True

    prepared = build_trainer(cpu_plan(tmp_path, **{"training.optim": "adamw_torch"}), progress=False)
    opt = prepared.trainer.create_optimizer()
    assert isinstance(opt, torch.optim.AdamW) and not opt.defaults.get("fused")


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_attention_implementation_is_the_planned_one(tmp_path, impl):
    prepared = _train(tmp_path, steps=1, **{"model.attn_implementation": impl})
    model = prepared.trainer.model
    assert model.config._attn_implementation == impl
    assert model.model.layers[0].self_attn.config._attn_implementation == impl


def _count_mlp_calls(model):
    calls = []
    # A pre-hook: torch's non-reentrant checkpoint stops recomputing once the saved tensors are
    # rebuilt, which can be before the MLP returns, so a forward (post) hook may not fire again.
    handle = model.model.layers[0].mlp.gate_proj.register_forward_pre_hook(lambda *a: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("on", [True, False])
def test_gradient_checkpointing_is_active_in_the_decoder_layers(tmp_path, on):
    prepared = build_trainer(cpu_plan(tmp_path, **{"training.max_steps": 1, "training.gradient_checkpointing": on}), progress=False)
    calls, handle = _count_mlp_calls(prepared.model)
    prepared.trainer.train()
    handle.remove()
    model = prepared.trainer.model
    assert prepared.trainer.args.activation_checkpointing is on
    assert model.is_activation_checkpointing is on
    assert all(layer.gradient_checkpointing is on for layer in model.model.layers)
    # With checkpointing the backward pass recomputes each layer: its MLP runs twice per step.
    assert len(calls) == (2 if on else 1)


def test_per_device_batch_and_accumulation_reach_the_loop(tmp_path):
    prepared = build_trainer(
        cpu_plan(
            tmp_path,
            **{
                "training.max_steps": 2,
                "training.per_device_train_batch_size": 3,
                "training.gradient_accumulation_steps": 2,
                "training.effective_batch_size": 6,
            },
        ),
        progress=False,
    )
    shapes = []
    handle = prepared.model.register_forward_pre_hook(
        lambda mod, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    prepared.trainer.train()
    handle.remove()
    assert shapes == [(3, 64)] * 4  # 2 optimizer steps x 2 micro-batches of 3 x seq_len
    assert prepared.trainer.state.global_step == 2


def test_bf16_autocasts_the_matmuls(tmp_path):
    prepared = build_trainer(cpu_plan(tmp_path, **{"training.max_steps": 1, "training.bf16": True}), progress=False)
    dtypes = []
    handle = prepared.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    prepared.trainer.train()
    handle.remove()
    assert prepared.trainer.accelerator.mixed_precision == "bf16"
    assert dtypes and dtypes[0] == torch.bfloat16
    assert next(prepared.model.parameters()).dtype == torch.float32  # AMP keeps fp32 master weights


def test_weights_load_in_the_planned_dtype(tmp_path):
    prepared = build_trainer(cpu_plan(tmp_path, **{"model.dtype": "bfloat16"}), progress=False)
    assert next(prepared.model.parameters()).dtype == torch.bfloat16


def test_dataloader_workers_and_pin_memory_reach_the_dataloader(tmp_path):
    prepared = build_trainer(cpu_plan(tmp_path, **{"training.dataloader_num_workers": 1}), progress=False)
    dl = prepared.trainer.get_train_dataloader()
    assert dl.num_workers == 1 and dl.pin_memory is False
    # A GPU plan's pin memory reaches the DataLoader (built here without training).
    prepared = build_trainer(cpu_plan(tmp_path, hardware=H100_PROFILE, **{"training.dataloader_pin_memory": True}), progress=False)
    assert prepared.trainer.args.dataloader_pin_memory is True
    assert prepared.trainer.get_train_dataloader().pin_memory is True


def test_workers_load_batches_during_training(tmp_path):
    prepared = _train(tmp_path, steps=2, **{"training.dataloader_num_workers": 1})
    assert prepared.trainer.state.global_step == 2


@pytest.mark.parametrize("every,expected", [(2, 2), (0, 0)])
def test_torch_empty_cache_steps_clears_the_cache(tmp_path, monkeypatch, every, expected):
    import transformers.trainer as trainer_module

    real = trainer_module.clear_device_cache
    calls = []

    def counting(*args, **kwargs):  # a spy: counts, then calls the real function
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "clear_device_cache", counting)
    prepared = _train(tmp_path, steps=4, **{"training.torch_empty_cache_steps": every})
    assert prepared.trainer.args.torch_empty_cache_steps == (every or None)
    assert len(calls) == expected  # global steps 0 and 2 of 4


def test_torch_compile_compiles_the_model_with_the_planned_backend(tmp_path):
    from torch._dynamo.eval_frame import OptimizedModule
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    prepared = _train(tmp_path, steps=2, **{"training.torch_compile": True, "training.torch_compile_backend": "eager"})
    trainer = prepared.trainer
    assert trainer.args.torch_compile is True and trainer.args.torch_compile_backend == "eager"
    assert trainer.accelerator.state.dynamo_plugin.backend.value.lower() == "eager"
    assert isinstance(trainer.model_wrapped, OptimizedModule)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo really captured the forward
    torch._dynamo.reset()
