"""Names the spec accepts, as data, so the plan path never imports transformers or torch.

Copied from transformers 5.24 (training_args.OptimizerNames, trainer_utils.SchedulerType)
and torch 2.13 (torch._dynamo.list_backends(exclude_tags=())); tests/spec/test_spec_names.py
fails when the installed packages disagree.
"""

from __future__ import annotations

OPTIMIZER_NAMES = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adafactor",
    "adamw_anyprecision",
    "adamw_torch_4bit",
    "adamw_torch_8bit",
    "ademamix",
    "sgd",
    "adagrad",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "ademamix_8bit",
    "lion_8bit",
    "lion_32bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
    "galore_adamw",
    "galore_adamw_8bit",
    "galore_adafactor",
    "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise",
    "lomo",
    "adalomo",
    "grokadamw",
    "schedule_free_radam",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "apollo_adamw",
    "apollo_adamw_layerwise",
    "stable_adamw",
)

# Optimizers older transformers had and 5.x removed -> what replaces them.
REMOVED_OPTIMIZERS = {
    "adamw_apex_fused": "adamw_torch_fused",  # apex fused AdamW; torch's fused kernel is the successor
    "adamw_hf": "adamw_torch",  # transformers' own AdamW, removed in 4.x/5.x
    "adamw_torch_fused_xla": "adamw_torch_xla",
}

# Optimizers that run on bitsandbytes (transformers trainer_optimizer.py imports it for these).
BNB_OPTIMIZERS = frozenset(
    n for n in OPTIMIZER_NAMES if n.endswith(("_8bit", "_32bit", "rmsprop_bnb")) and not n.startswith(("adamw_torch", "galore"))
)

SCHEDULER_TYPES = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)

# torch._dynamo backends usable for training that the Trainer can pass on: it builds
# accelerate's TorchDynamoPlugin, whose DynamoBackend enum (accelerate 1.15
# utils/dataclasses.py) rejects torch's openxla, ts, aot_ts and the aot_eager_* variants.
COMPILE_BACKENDS = ("inductor", "cudagraphs", "aot_eager", "eager", "tvm")
# Backends that need a package beyond torch (torch/_dynamo/backends/tvm.py imports tvm).
COMPILE_BACKEND_PACKAGES = {"tvm": "tvm"}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
