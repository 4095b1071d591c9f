"""SDPA, dropout and autocast as CUDA runs them, for the fake-tensor trace on a CPU build of torch.

On CPU, F.scaled_dot_product_attention picks the CPU flash kernel, and the math
kernel (which keeps the (b, a, s, s) probabilities) whenever dropout is on; CUDA
picks flash or memory-efficient attention, which keep only the output and a
log-sum-exp per row. During a trace we call the CUDA kernels' aten ops directly:
under FakeTensorMode they run their meta implementations (shapes only), and their
autograd formulas save exactly what the CUDA kernels save.

Selection, after torch's sdp_utils (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
CUDA dispatch order flash -> efficient -> math): flash needs fp16/bf16, head_dim
<= 256 and no explicit mask; it handles dropout, is_causal and grouped-query
attention. Otherwise the memory-efficient kernel (fp32, masks); for grouped-query
attention it gets k and v repeated to all heads (an upper bound: the copies are
kept for backward).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F


def _cuda_like_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if torch.is_autocast_enabled("cpu"):
        dt = torch.get_autocast_dtype("cpu")  # autocast's cast of SDPA inputs (lower-precision list)
        query, key, value = (t.to(dt) if t.is_floating_point() and t.dtype != dt else t for t in (query, key, value))
    half = query.dtype in (torch.float16, torch.bfloat16)
    if half and query.shape[-1] <= 256 and attn_mask is None:
        out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)
        return out[0]
    if key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    need_lse = query.requires_grad or key.requires_grad or value.requires_grad
    out = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)
    return out[0]


def _cuda_like_dropout(input, p=0.5, training=True, inplace=False):
    """aten::dropout on CUDA takes the fused native_dropout kernel (aten/src/ATen/native/
    Dropout.cpp is_fused_kernel_acceptable), which keeps a bool mask (1 byte per element);
    the CPU path keeps a mask in the input's dtype instead."""
    if not training or p == 0.0:
        return input
    return torch.ops.aten.native_dropout(input, p, True)[0]


@contextmanager
def cuda_like_ops():
    """CUDA's SDPA kernels, fused dropout and autocast cast policy (trace/cuda_autocast.py)."""
    from gpuplan.trace.cuda_autocast import cuda_autocast_policy

    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention = _cuda_like_sdpa
    F.dropout = _cuda_like_dropout
    try:
        with cuda_autocast_policy():
            yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved
