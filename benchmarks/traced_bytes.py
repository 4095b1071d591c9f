"""Bytes an eager PyTorch region moves, traced op by op: the sum, over every aten op that does work, of the bytes of
its tensor inputs and outputs (a TorchDispatchMode sees each op after autograd and autocast, so the casts autocast
inserts and the backward's ops are counted as they run). Views and metadata ops move nothing (kernel_counts.NO_WORK);
`skip` names ops priced elsewhere (the GEMMs, whose time is their FLOPs; the attention kernel). Used by
adapter_traffic.py and layer_traffic.py."""

from __future__ import annotations

from kernel_counts import NO_WORK

# GEMMs and the attention kernel: the step-time model prices them by FLOPs (terms.matmul_terms, attention_terms)
COMPUTE_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "matmul",
        "linear",
        "embedding",
        "embedding_dense_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "scaled_dot_product_attention",
    }
)


def byte_counter(skip: frozenset[str] = frozenset()):
    """A TorchDispatchMode class whose instances add up the bytes (`total`) and the bytes by op (`by_op`)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Bytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.total = 0
            self.by_op: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if "aten::" + name not in NO_WORK and name not in skip:
                leaves = tree_flatten((args, kwargs or {}))[0] + tree_flatten(out)[0]
                n = sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
                self.total += n
                self.by_op[name] = self.by_op.get(name, 0) + n
            return out

    return Bytes
