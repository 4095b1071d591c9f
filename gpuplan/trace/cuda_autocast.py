"""CUDA's autocast cast policy, applied to CPU (fake) tensors under `torch.autocast("cpu")`.

The trace runs on fake CPU tensors (a CPU build of torch cannot run autograd on fake cuda
tensors: trace/build.py), so plain CPU autocast would decide the dtypes. The two policies
differ (docs/reference/cuda-autocast.md): CUDA runs softmax, log_softmax, layer_norm,
pow, rsqrt, exp, sum, cumsum and more in float32 and casts einsum, addmv, mv, addr to half;
CPU does neither, and promotes cat/stack/index_copy, which CUDA leaves to the op.

`cuda_autocast_policy()` re-registers, for the AutocastCPU dispatch key, every op the
installed torch registers for AutocastCUDA with the policy CUDA uses for it
(aten/src/ATen/autocast_mode.cpp, torch 2.13: the KERNEL_CUDA lists and the CastPolicy
wrappers, reproduced by `_cast_args` below), and a fallthrough for the ops only CPU
autocasts. Lower-precision ops both devices cast keep CPU's C++ kernel (identical policy,
and it keeps autocast's weight-cast cache). The kernels sit where autocast's do, above
autograd, so the casts are recorded in the graph and saved for backward as on CUDA.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

# autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCUDA, m), torch 2.13.
LOWER_PRECISION = frozenset(
    {
        "_convolution",
        "_convolution.deprecated",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d.input",
        "conv_transpose3d.input",
        "convolution",
        "prelu",
        "addmm",
        "addmv",
        "addr",
        "matmul",
        "einsum",
        "mm",
        "mv",
        "linalg_vecdot",
        "linear",
        "addbmm",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "linalg_multi_dot",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "lstm_cell",
        "gru_cell",
        "rnn_tanh_cell",
        "rnn_relu_cell",
        "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
        "cudnn_convolution",
        "cudnn_convolution_transpose",
    }
)
FP32 = frozenset(
    {
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow.Tensor_Scalar",
        "pow.Tensor_Tensor",
        "pow.Scalar",
        "softplus",
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "rms_norm",
        "frobenius_norm.dim",
        "nuclear_norm",
        "nuclear_norm.dim",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "nll_loss2d",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "upsample_nearest1d",
        "_upsample_nearest_exact1d",
        "upsample_nearest2d",
        "_upsample_nearest_exact2d",
        "upsample_nearest3d",
        "_upsample_nearest_exact3d",
        "upsample_linear1d",
        "upsample_bilinear2d",
        "_upsample_bilinear2d_aa",
        "upsample_trilinear3d",
        "upsample_bicubic2d",
        "_upsample_bicubic2d_aa",
    }
)
# float32 unless the call gives a dtype (CastPolicy::fp32_set_opt_dtype): the output is float32
FP32_SET_OPT_DTYPE = frozenset(
    {
        "prod",
        "prod.dim_int",
        "softmax.int",
        "log_softmax.int",
        "cumprod",
        "cumsum",
        "linalg_vector_norm",
        "linalg_matrix_norm",
        "linalg_matrix_norm.str_ord",
        "sum",
        "sum.dim_IntList",
    }
)
# redispatched to the overload with a dtype argument, float32 (CastPolicy::fp32_append_dtype)
FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.dtype"}
PROMOTE = frozenset(
    {
        "addcdiv",
        "addcmul",
        "atan2",
        "bilinear",
        "cross",
        "dot",
        "vdot",
        "grid_sampler",
        "index_put",
        "tensordot",
        "scatter_add",
    }
)
BANNED = frozenset({"binary_cross_entropy"})  # CUDA autocast raises: "unsafe to autocast"
# CPU autocast's lower-precision list (autocast_mode.cpp, AutocastCPU): shared ops keep CPU's kernel
CPU_LOWER_PRECISION = frozenset(
    {
        "conv1d",
        "conv1d.padding",
        "conv2d",
        "conv2d.padding",
        "conv3d",
        "conv3d.padding",
        "bmm",
        "mm",
        "linalg_vecdot",
        "baddbmm",
        "addmm",
        "addbmm",
        "linear",
        "_convolution.deprecated",
        "matmul",
        "conv_tbc",
        "mkldnn_rnn_layer",
        "conv_transpose1d",
        "conv_transpose2d.input",
        "conv_transpose3d.input",
        "prelu",
        "scaled_dot_product_attention",
        "_native_multi_head_attention",
    }
)


def cuda_policy(op: str) -> str | None:
    """CUDA autocast's policy for an aten overload name ("softmax.int"), None when it has none."""
    for name, ops in (
        ("lower_precision_fp", LOWER_PRECISION),
        ("fp32", FP32),
        ("fp32_set_opt_dtype", FP32_SET_OPT_DTYPE),
        ("fp32_append_dtype", FP32_APPEND_DTYPE),
        ("promote", PROMOTE),
        ("banned", BANNED),
    ):
        if op in ops:
            return name
    return None


def _registered(key: str) -> set[str]:
    return {n.removeprefix("aten::") for n in torch._C._dispatch_get_registrations_for_dispatch_key(key) if n.startswith("aten::")}


def _eligible(t) -> bool:
    """autocast's is_eligible: a defined floating-point tensor on the device, not float64."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _map(fn, args, kwargs):
    def one(a):
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(fn(x) for x in a)
        return fn(a)

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def _cast_to(dtype):
    return lambda t: t.to(dtype) if _eligible(t) and t.dtype != dtype else t


def _promoted(args, kwargs, lower) -> torch.dtype:
    """autocast's promote_type: float32 if any eligible input is float32, else the lower dtype."""
    flat = [a for v in (*args, *kwargs.values()) for a in (v if isinstance(v, (list, tuple)) else (v,))]
    return torch.float32 if any(_eligible(a) and a.dtype == torch.float32 for a in flat) else lower


def _kernel(op_name: str, policy: str):
    packet, _, overload = op_name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    names = [a.name for a in op._schema.arguments]
    dtype_at = names.index("dtype") if "dtype" in names else len(names)

    def kernel(*args, **kwargs):
        lower = torch.get_autocast_dtype("cpu")
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if policy == "lower_precision_fp":
                args, kwargs = _map(_cast_to(lower), args, kwargs)
            elif policy == "fp32":
                args, kwargs = _map(_cast_to(torch.float32), args, kwargs)
            elif policy == "promote":
                args, kwargs = _map(_cast_to(_promoted(args, kwargs, lower)), args, kwargs)
            elif policy == "fp32_set_opt_dtype" and args and _eligible(args[0]):
                if dtype_at < len(args):  # the dispatcher passes schema arguments positionally
                    if args[dtype_at] is None:
                        args = (*args[:dtype_at], torch.float32, *args[dtype_at + 1 :])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif policy == "fp32_append_dtype" and args and _eligible(args[0]):
                target = FP32_APPEND_DTYPE[op_name].partition(".")[2]
                return getattr(getattr(torch.ops.aten, packet), target)(*args, **kwargs, dtype=torch.float32)
            elif policy == "banned":
                raise RuntimeError(
                    f"torch.{packet} is unsafe to autocast on CUDA (CUDA autocast refuses it); use binary_cross_entropy_with_logits"
                )
            return op(*args, **kwargs)

    return kernel


def unlisted_ops() -> list[str]:
    """Ops this torch registers for AutocastCUDA that the table above lacks (a newer torch):
    the trace leaves them to CPU autocast, and says so in its notes."""
    return sorted(op for op in _registered("AutocastCUDA") if cuda_policy(op) is None)


def policy_changes() -> dict[str, str]:
    """Op -> what CUDA autocast does differently from CPU autocast in this torch ("fallthrough" = CPU only)."""
    cuda, cpu = _registered("AutocastCUDA"), _registered("AutocastCPU")
    out = {}
    for op in sorted(cuda):
        policy = cuda_policy(op)
        if policy is None:
            continue  # unlisted_ops(): left to CPU autocast
        if policy == "lower_precision_fp" and op in CPU_LOWER_PRECISION:
            continue  # same policy: CPU's kernel, with its weight-cast cache
        out[op] = policy
    for op in sorted(cpu - cuda):
        out[op] = "fallthrough"
    return out


@contextmanager
def cuda_autocast_policy():
    """Inside: `torch.autocast("cpu", dtype)` casts as `torch.autocast("cuda", dtype)` would."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": the point here
            for op, policy in policy_changes().items():
                fn = torch.library.fallthrough_kernel if policy == "fallthrough" else _kernel(op, policy)
                lib.impl(op, fn, "AutocastCPU")
        yield
    finally:
        lib._destroy()
