"""The checkpointing note for a frozen LoRA base says what transformers runs: non-reentrant checkpointing."""

from __future__ import annotations

import functools

from tests.helpers.planning import plan_text, spec


def test_lora_checkpointing_note_says_non_reentrant(tmp_path):
    plan = plan_text(tmp_path, spec("llama-160m", "A100-80GB", extra='method = "lora"', training="gradient_checkpointing = true"))
    [note] = [n for n in plan.memory.notes if n.startswith("checkpointing a frozen base")]
    assert "use_reentrant=False" in note and "with reentrant checkpointing" not in note


def test_transformers_checkpoints_non_reentrantly_and_adapters_get_gradients_without_input_grads():
    """The note's facts, on the installed transformers and peft: the default kwargs the Trainer leaves in
    place are use_reentrant=False, and LoRA weights inside checkpointed layers get gradients with no
    enable_input_require_grads()."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=64
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.activation_checkpointing_enable()  # no kwargs: what the Trainer calls (trainer.py) by default
    layer = model.model.layers[0]
    func = layer._gradient_checkpointing_func
    assert isinstance(func, functools.partial) and func.keywords == {"use_reentrant": False}
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    peft.train()
    ids = torch.randint(0, 64, (2, 8))
    peft(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in peft.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
