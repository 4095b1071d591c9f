"""Which model_types are counted analytically, and for which tasks.

The task lists mirror transformers 5.24's auto mappings
(transformers/models/auto/modeling_auto.py: MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES);
tests/modelinfo/test_modelinfo_exact.py checks them against the installed transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gpuplan.modelinfo.families_classic as classic
import gpuplan.modelinfo.families_decoder as decoder
from gpuplan.modelinfo.errors import ModelConfigError
from gpuplan.modelinfo.params import Dims, ParamList
from gpuplan.modelinfo.vision_families import ANALYTIC as VLM_ANALYTIC

# task name -> the transformers Auto class that builds the model for it
TASKS: dict[str, str] = {
    "causal-lm": "AutoModelForCausalLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
}

Counter = Callable[[str, Mapping[str, Any], str, int], tuple[ParamList, Dims]]

# model_type -> (counter, tasks transformers supports for it)
FAMILIES: dict[str, tuple[Counter, tuple[str, ...]]] = {
    **{mt: (decoder.count_llama_like, decoder.DECODER_TASKS) for mt in decoder.LLAMA_LIKE},
    "phi3": (decoder.count_phi3, decoder.DECODER_TASKS),
    "phi": (decoder.count_phi, decoder.DECODER_TASKS),
    "gpt2": (classic.count_gpt2, classic.GPT_TASKS),
    "gpt_neox": (classic.count_gpt_neox, classic.GPT_TASKS),
    "opt": (classic.count_opt, classic.GPT_TASKS),
    "bert": (classic.count_bert_like, classic.ENCODER_TASKS),
    "roberta": (classic.count_bert_like, classic.ENCODER_TASKS),
}


def known_model_types() -> tuple[str, ...]:
    """model_types counted without torch, sorted (the text families and the analytic vision-language ones)."""
    return tuple(sorted({*FAMILIES, *VLM_ANALYTIC}))


def unsupported_task(model_type: str, task: str, supported: tuple[str, ...]) -> ModelConfigError:
    return ModelConfigError(
        None,
        f"task {task!r} is not supported for model_type {model_type!r}: transformers has no "
        f"{TASKS[task]} class for it; supported tasks: {', '.join(supported)}",
    )
