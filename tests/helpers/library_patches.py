"""Undo the process-wide monkey patches a library applies in a test.

Liger's `apply_liger_kernel_to_llama` (liger_kernel/transformers/monkey_patch.py) swaps names in
transformers' modeling modules (`modeling_llama.LlamaRMSNorm = LigerRMSNorm`, `apply_rotary_pos_emb`,
`LlamaMLP`), may set `LlamaForCausalLM.forward`, and may replace `nn.functional.cross_entropy`
through transformers.loss. In an xdist worker every later test that builds a Llama would get
Liger's modules, and the apply audit would rightly report `training.use_liger_kernel: live True`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

_PREFIXES = ("transformers.models.", "transformers.loss")
_PATCHED = ("transformers.models.llama.modeling_llama", "transformers.loss.loss_utils")


def _modules() -> list[Any]:
    return [m for name, m in list(sys.modules.items()) if m is not None and name.startswith(_PREFIXES)]


@contextlib.contextmanager
def transformers_globals_restored() -> Iterator[None]:
    """Snapshot the modeling modules' names, their classes' forwards and torch's functional
    namespace; put every changed one back afterwards. The modules Liger patches for a Llama are
    imported first, so a test that is the first to load them still has them restored."""
    import importlib

    import torch.nn.functional as F

    for name in _PATCHED:
        importlib.import_module(name)

    modules = {id(m): (m, dict(vars(m))) for m in _modules()}
    forwards = {
        cls: cls.__dict__["forward"]
        for _, names in modules.values()
        for cls in names.values()
        if isinstance(cls, type) and "forward" in cls.__dict__
    }
    functional = dict(vars(F))
    try:
        yield
    finally:
        for m, names in modules.values():
            current = vars(m)
            for key, value in names.items():
                if current.get(key) is not value:
                    setattr(m, key, value)
        for cls, fwd in forwards.items():
            if cls.__dict__.get("forward") is not fwd:
                cls.forward = fwd
        for key, value in functional.items():
            if vars(F).get(key) is not value:
                setattr(F, key, value)
