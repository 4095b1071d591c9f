"""Tokenizers for apply: the model directory's own, or a byte-level one built in code.

The byte-level tokenizer needs no files, so a model trained from scratch can start from
a config alone. Ids (documented contract, the tiny configs in specs/models/ agree):

    0..255  the bytes of the UTF-8 text, id == byte value
    256     <pad>
    257     <bos>
    258     <eos>
    259     <unk>   (never produced from text: every byte has an id)
    260     <mask>  only when built with `with_mask=True` (masked-lm needs vocab >= 261)
"""

from __future__ import annotations

import os
from typing import Any

from gpuplan.apply.errors import ApplyError

PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID = 256, 257, 258, 259, 260
SPECIAL_TOKENS = {"<pad>": PAD_ID, "<bos>": BOS_ID, "<eos>": EOS_ID, "<unk>": UNK_ID}


def bytes_to_unicode() -> dict[int, str]:
    """Byte -> printable character table of GPT-2's byte-level BPE.

    Source: openai/gpt-2 src/encoder.py `bytes_to_unicode`; the `tokenizers` ByteLevel
    pre-tokenizer uses the same table, so its output characters index this vocab.
    """
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def byte_level_tokenizer(*, with_mask: bool = False) -> Any:
    """A fast tokenizer mapping each UTF-8 byte to its own id (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    specials = dict(SPECIAL_TOKENS)
    if with_mask:
        specials["<mask>"] = MASK_ID
    vocab.update(specials)
    # No merges: a BPE over the 256 byte symbols is exactly "one byte, one token".
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(specials))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        mask_token="<mask>" if with_mask else None,
        model_max_length=1 << 30,  # positions are the model's limit, not the tokenizer's
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    if ids != specials:  # the contract above is what the configs rely on
        raise AssertionError(f"byte-level special ids drifted: {ids} != {specials}")
    return tok


def has_tokenizer_files(model_dir: str) -> bool:
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model", "vocab.json")
    return any(os.path.isfile(os.path.join(model_dir, n)) for n in names)


def load_tokenizer(model_dir: str | None, *, task: str, from_scratch: bool = True, trust_remote_code: bool = False) -> Any:
    """The tokenizer of `model_dir` when it ships one, else (from scratch only) the byte-level one.

    Fine-tuning a directory without tokenizer files is an error: its embeddings were
    trained on some vocabulary that bytes would not match.
    """
    if model_dir is not None and os.path.isdir(model_dir) and not has_tokenizer_files(model_dir) and not from_scratch:
        raise ApplyError(
            f"model.name_or_path: {model_dir} has no tokenizer files (tokenizer.json, tokenizer_config.json, "
            "vocab.txt, ...); copy the tokenizer of the pretrained model into it"
        )
    if model_dir is not None and os.path.isdir(model_dir) and has_tokenizer_files(model_dir):
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code, local_files_only=True)
        except (OSError, ValueError) as e:
            raise ApplyError(f"model.name_or_path: cannot load the tokenizer in {model_dir}: {e}", key="model.name_or_path") from e
        if tok.pad_token is None:
            # Causal LMs often ship without a pad token; padding reuses eos, labels mask it out.
            if tok.eos_token is None:
                raise ApplyError(
                    f"model.name_or_path: the tokenizer in {model_dir} has neither a pad nor an eos token; "
                    'add "pad_token" to its tokenizer_config.json'
                )
            tok.pad_token = tok.eos_token
        if task == "masked-lm" and tok.mask_token is None:
            raise ApplyError(
                f'model.task = "masked-lm" needs a mask token, and the tokenizer in {model_dir} has none; '
                'use a tokenizer with a mask token or task = "causal-lm"'
            )
        return tok
    return byte_level_tokenizer(with_mask=task == "masked-lm")
