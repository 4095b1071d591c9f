"""Model states: weights, gradients and optimizer states, bytes per tensor.

Pure functions over ModelFacts.param_shapes; no torch. Sources:
- torch.optim.AdamW keeps exp_avg and exp_avg_sq in the parameter's dtype
  (torch/optim/adamw.py -> adam.py `_init_group`: torch.zeros_like(p)) and a
  scalar `step` tensor per parameter (fp32, 4 bytes).
- bitsandbytes 0.50 optim/optimizer.py `Optimizer2State.init_state` /
  `Optimizer1State.init_state`: 8-bit states are uint8, one byte per value, plus
  one fp32 absmax per block of 256 values per state; tensors with fewer than
  `min_8bit_size` = 4096 elements keep fp32 states; 32-bit bnb states are fp32
  whatever the parameter dtype. The two 256-entry fp32 quantization maps are
  shared by all tensors (2 KiB, counted once).
- transformers optimization.py `Adafactor._init_state` path (in `step`): for a
  tensor of >= 2 dims, exp_avg_sq_row (shape[:-1]) and exp_avg_sq_col
  (shape[:-2] + shape[-1:]); else exp_avg_sq (shape); exp_avg only when beta1 is
  set (Trainer passes beta1=None via the default); states follow the gradient
  cast to fp32 (`grad.float()` for fp16/bf16 gradients), so 4 bytes per value.
- torch.optim.SGD: momentum_buffer only when momentum != 0; the Trainer's `sgd`
  passes no momentum (transformers 5.24 trainer_optimizer.py `_get_sgd`), so none.
- torch.optim.Adagrad: `sum` in the parameter dtype plus a scalar step.
- Lion (bitsandbytes Optimizer1State): one state (exp_avg).
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

BNB_BLOCK = 256  # bitsandbytes blockwise quantization block size (optimizer.py init_state)
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer*State default min_8bit_size
BNB_QMAP_BYTES = 2 * 256 * 4  # "dynamic" + "udynamic" fp32 maps, shared

# OptimizerNames value -> (family, number of states, 8-bit)
_BNB = {
    "adamw_bnb_8bit": 2,
    "adamw_8bit": 2,
    "paged_adamw_8bit": 2,
    "paged_adamw_32bit": 2,
    "lion_8bit": 1,
    "paged_lion_8bit": 1,
    "lion_32bit": 1,
    "paged_lion_32bit": 1,
    "rmsprop_bnb_8bit": 1,
    "rmsprop_bnb_32bit": 1,
    "rmsprop_bnb": 1,
    "ademamix_8bit": 3,
    "paged_ademamix_8bit": 3,
    "ademamix": 3,
    "paged_ademamix_32bit": 3,
}


def optimizer_kind(optim: str) -> tuple[str, str | None]:
    """(kind, note). kind in adamw, adamw_fused, bnb8:<n>, bnb32:<n>, adafactor, sgd, adagrad, rmsprop."""
    o = optim.lower()
    if o in (
        "adamw_torch",
        "adamw_hf",
        "adamw_torch_xla",
        "adamw_torch_npu_fused",
        "adamw_apex_fused",
        "adamw_anyprecision",
        "stable_adamw",
        "grokadamw",
    ):
        return "adamw", None
    if o == "adamw_torch_fused":
        return "adamw_fused", None
    if o in _BNB:
        bits = "bnb8" if "8bit" in o else "bnb32"
        return f"{bits}:{_BNB[o]}", None
    if o == "adafactor":
        return "adafactor", None
    if o == "sgd":
        return "sgd", None
    if o == "adagrad":
        return "adagrad", None
    if o == "rmsprop":
        return "rmsprop", None
    return "adamw", f"optimizer {optim!r} has no memory model; estimated as AdamW (two states per parameter)"


def _numels(param_shapes) -> tuple[int, ...]:
    return tuple(prod(shape) if shape else 1 for _, shape in param_shapes)


# nn.Embedding weights of the supported families (modelinfo names), tied heads included.
EMBEDDING_MODULES = frozenset(
    {"embed_tokens", "embed_in", "embed_positions", "wte", "wpe", "word_embeddings", "position_embeddings", "token_type_embeddings"}
)


def is_embedding(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in EMBEDDING_MODULES


@lru_cache(maxsize=512)
def bnb_state_bytes(param_shapes: tuple, n_states: int, eight_bit: bool) -> int:
    """Bytes of bitsandbytes optimizer states for these tensors (init_state layout).

    The Trainer keeps every nn.Embedding weight at 32-bit states under an 8-bit
    optimizer (transformers trainer.py create_optimizer: GlobalOptimManager
    register_module_override(module, "weight", {"optim_bits": 32})): for Llama-3.1-8B
    that is 525M parameters at 8 bytes instead of ~2.
    """
    total = 0
    any_8bit = False
    for (name, _), n in zip(param_shapes, _numels(param_shapes)):
        if eight_bit and n >= BNB_MIN_8BIT_SIZE and not is_embedding(name):
            blocks = -(-n // BNB_BLOCK)
            total += n_states * (n + 4 * blocks)  # uint8 state + fp32 absmax per block
            any_8bit = True
        else:
            total += n_states * 4 * n  # fp32 states
    return total + (BNB_QMAP_BYTES if any_8bit else 0)


@lru_cache(maxsize=512)
def adafactor_state_bytes(param_shapes: tuple) -> int:
    """Bytes of transformers Adafactor states (beta1=None): fp32 row/col factors or full 1-D."""
    total = 0
    for _, shape in param_shapes:
        if len(shape) >= 2:
            rows = prod(shape[:-1])
            cols = prod(shape[:-2]) * shape[-1]
            total += 4 * (rows + cols)
        else:
            total += 4 * (prod(shape) if shape else 1)
        total += 4  # RMS is a python float; step an int: no tensor. 4 bytes slack per tensor for the scalar ops
    return total


def optimizer_state_bytes(kind: str, n_params: int, n_tensors: int, param_shapes: tuple, weight_bytes: int) -> int:
    """Persistent optimizer state bytes at steady state (after the first step)."""
    if kind in ("adamw", "adamw_fused"):
        # exp_avg + exp_avg_sq in param dtype + fp32 step scalar per tensor
        return 2 * weight_bytes * n_params + 4 * n_tensors
    try:
        hash(param_shapes)
    except TypeError:
        param_shapes = tuple((n, tuple(s)) for n, s in param_shapes)
    if kind.startswith("bnb"):
        bits, n = kind.split(":")
        return bnb_state_bytes(param_shapes, int(n), bits == "bnb8")
    if kind == "adafactor":
        return adafactor_state_bytes(param_shapes)
    if kind == "sgd":
        return 0
    if kind in ("adagrad", "rmsprop"):
        return weight_bytes * n_params + 4 * n_tensors
    raise ValueError(f"unknown optimizer kind {kind!r}")


def optimizer_step_temp_bytes(kind: str, n_params: int, largest_tensor: int, weight_bytes: int) -> int:
    """Transient bytes the step itself allocates on top of states and grads.

    torch AdamW foreach (torch/optim/adam.py `_multi_tensor_adam`): exp_avg_sq_sqrt =
    torch._foreach_sqrt(exp_avg_sqs) for every tensor of a device/dtype group at once
    -> one more state's worth. The fused kernel allocates none. Adafactor
    (transformers optimization.py step): per tensor, update = grad**2 + eps (full
    size, fp32), then the factored approximation r x c (full size, made while the first
    is alive) and -update * lr (full size, while the update is alive): two full-size
    fp32 temporaries of the largest tensor at once.
    bitsandbytes kernels update in place.
    """
    if kind == "adamw":
        return weight_bytes * n_params
    if kind == "adafactor":
        return 2 * 4 * largest_tensor
    return 0
