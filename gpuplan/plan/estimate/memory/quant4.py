"""The 4-bit frozen base of QLoRA: bytes per bitsandbytes Linear4bit, and which layers are 4-bit.

bitsandbytes 0.50 functional.quantize_4bit (what Params4bit._quantize calls when the
model is loaded with BitsAndBytesConfig(load_in_4bit=True)), blocksize 64:
- the packed weight: uint8, two 4-bit values per byte: ceil(n / 2) bytes;
- without double quantization: absmax, one fp32 per block of 64: 4 x ceil(n / 64);
- with double quantization (bnb_4bit_use_double_quant, compress_statistics=True): the
  absmax minus its mean quantized blockwise (quantize_blockwise, blocksize 256): one uint8
  per 64-block, the fp32 offset (a scalar), and the nested state's fp32 absmax, one per
  256 blocks; the nested code is the shared 256-entry "dynamic" map (name2qmap, once per device);
- the 4-bit code itself: get_4bit_type returns 16 fp32 values per QuantState.
transformers (quantizers/base.py get_keys_to_not_convert) keeps the output embedding,
tied weights and the model's last module unquantized: the LM head or the seq-cls head;
embeddings and norms are not Linear, so they stay too. peft's
prepare_model_for_kbit_training then casts every fp16/bf16 parameter that is not
Params4bit to fp32 (peft/utils/other.py): embeddings, norms, biases and the head.
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.modelinfo.lora_targets import OUTPUT_LAYERS, SEQ_CLS_HEADS

BLOCK = 64  # bitsandbytes 4-bit default blocksize (functional.quantize_4bit)
NESTED_BLOCK = 256  # quantize_blockwise blocksize of the double-quantized absmax
CODE_4BIT_BYTES = 16 * 4  # get_4bit_type: 16 fp32 values per QuantState
DYNAMIC_MAP_BYTES = 256 * 4  # the shared nested code (create_dynamic_map), once


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def linear4bit_bytes(n: int, double_quant: bool) -> int:
    """Device bytes of one 4-bit weight of n values with its quantization state."""
    blocks = _ceil(n, BLOCK)
    if double_quant:
        stats = blocks + 4 + 4 * _ceil(blocks, NESTED_BLOCK)
    else:
        stats = 4 * blocks
    return _ceil(n, 2) + stats + CODE_4BIT_BYTES


def quantized_layers(facts: ModelFacts) -> tuple[tuple[str, str, int, int], ...]:
    """The Linear/Conv1D layers transformers replaces with Linear4bit."""
    heads = SEQ_CLS_HEADS if facts.task == "seq-cls" else ()
    return tuple(
        layer
        for layer in facts.linear_layers
        if layer[0] not in OUTPUT_LAYERS and not any(layer[0] == h or layer[0].startswith(h + ".") for h in heads)
    )


@lru_cache(maxsize=256)
def base_4bit_split(facts: ModelFacts, double_quant: bool) -> tuple[int, int, int, int]:
    """(4-bit bytes, 4-bit weight values, values left unquantized, largest 4-bit layer's values)."""
    layers = quantized_layers(facts)
    q_bytes = sum(linear4bit_bytes(fi * fo, double_quant) for _, _, fi, fo in layers)
    q_values = sum(fi * fo for _, _, fi, fo in layers)
    largest = max((fi * fo for _, _, fi, fo in layers), default=0)
    if double_quant and layers:
        q_bytes += DYNAMIC_MAP_BYTES
    total = sum(prod(s) if s else 1 for _, s in facts.param_shapes)
    return q_bytes, q_values, total - q_values, largest
