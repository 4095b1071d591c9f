"""A real transformers LlamaTokenizer built from a small vocabulary, no download.

LlamaTokenizer in transformers 5 is BPE with byte fallback under a Metaspace pre-tokenizer
(prepend_scheme "first") and a post-processor that puts <s> first: the layout of Llama-2,
Mistral and TinyLlama. Every byte has a <0xNN> token, so any text encodes.
"""

from __future__ import annotations

from typing import Any

# Llama-2 / Mistral style: [INST] user [/INST] assistant</s>
LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def llama_tokenizer() -> Any:
    from transformers import LlamaTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in "\u2581abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789[]/.,!?":
        vocab.setdefault(piece, len(vocab))
    merges = [("\u2581", "H"), ("\u2581", "["), ("I", "N"), ("S", "T"), ("IN", "ST"), ("\u2581", "5")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)  # as Llama-2's tokenizer_config.json
    tok.chat_template = LLAMA2_TEMPLATE
    return tok
