"""One torchrun rank of `gpuplan.apply.worker` whose model is wrapped in a peft LoRA adapter.

The direct hook that stands in for `model.method = "lora"` until the spec has it: apply's
load_model is wrapped so the Trainer, accelerate's FSDP2 plugin and the checkpointing see
the PeftModel a LoRA plan will give them. Used by tests/test_fsdp_cpu_apply.py.
"""

from __future__ import annotations

import sys

import gpuplan.apply.model as apply_model

_load_model = apply_model.load_model


def load_lora_model(plan, tokenizer, label_names):
    from peft import LoraConfig, get_peft_model

    model = _load_model(plan, tokenizer, label_names)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


apply_model.load_model = load_lora_model

if __name__ == "__main__":
    from gpuplan.apply.worker import main

    sys.exit(main())
