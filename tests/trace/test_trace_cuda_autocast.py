"""The trace's autocast is CUDA's: per op of each list of the torch AMP documentation for CUDA
(docs/reference/cuda-autocast.md: lower precision, float32, promote), the dtype of the
op's output on fake CPU tensors under gpuplan.trace.cuda_autocast is the one CUDA autocast
gives, for fp16 and bf16. Plain CPU autocast gets several of them wrong (checked too)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from gpuplan.trace.cuda_autocast import cuda_autocast_policy, policy_changes, unlisted_ops

HALF = (torch.float16, torch.bfloat16)


def f32(*shape):
    return torch.randn(*shape)


# CUDA "ops that autocast to float16 / bfloat16": fp32 inputs, half output.
LOWER = {
    "__matmul__": lambda: f32(4, 8) @ f32(8, 8),
    "addbmm": lambda: torch.addbmm(f32(4, 8), f32(2, 4, 3), f32(2, 3, 8)),
    "addmm": lambda: torch.addmm(f32(4, 8), f32(4, 3), f32(3, 8)),
    "addmv": lambda: torch.addmv(f32(4), f32(4, 3), f32(3)),
    "addr": lambda: torch.addr(f32(4, 3), f32(4), f32(3)),
    "baddbmm": lambda: torch.baddbmm(f32(2, 4, 8), f32(2, 4, 3), f32(2, 3, 8)),
    "bmm": lambda: torch.bmm(f32(2, 4, 3), f32(2, 3, 8)),
    "multi_dot": lambda: torch.linalg.multi_dot([f32(4, 3), f32(3, 5), f32(5, 2)]),
    "conv1d": lambda: F.conv1d(f32(1, 2, 8), f32(4, 2, 3)),
    "conv2d": lambda: F.conv2d(f32(1, 2, 6, 6), f32(4, 2, 3, 3)),
    "conv3d": lambda: F.conv3d(f32(1, 2, 4, 4, 4), f32(4, 2, 3, 3, 3)),
    "conv_transpose1d": lambda: F.conv_transpose1d(f32(1, 2, 8), f32(2, 4, 3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(f32(1, 2, 6, 6), f32(2, 4, 3, 3)),
    "conv_transpose3d": lambda: F.conv_transpose3d(f32(1, 2, 4, 4, 4), f32(2, 4, 3, 3, 3)),
    "GRUCell": lambda: torch.nn.GRUCell(8, 6)(f32(4, 8)),
    "linear": lambda: F.linear(f32(4, 8), f32(6, 8), f32(6)),
    "LSTMCell": lambda: torch.nn.LSTMCell(8, 6)(f32(4, 8))[0],
    "matmul": lambda: torch.matmul(f32(2, 4, 8), f32(8, 3)),
    "mm": lambda: torch.mm(f32(4, 8), f32(8, 3)),
    "mv": lambda: torch.mv(f32(4, 8), f32(8)),
    "prelu": lambda: F.prelu(f32(4, 8), f32(1)),
    "RNNCell": lambda: torch.nn.RNNCell(8, 6)(f32(4, 8)),
    # torch 2.13's registrations beyond the documented list (cuda-autocast.md: "the code is the truth")
    "einsum": lambda: torch.einsum("ij,jk->ik", f32(4, 8), f32(8, 3)),
    "chain_matmul": lambda: torch.chain_matmul(f32(4, 3), f32(3, 5)),
}


def _half(dt):
    return lambda *shape: torch.randn(*shape).to(dt)


# CUDA "ops that autocast to float32": half inputs, float32 output.
def fp32_ops(dt):
    h = _half(dt)
    idx = torch.randint(0, 8, (4,))
    return {
        "__pow__": lambda: h(4, 8) ** 2,
        "__rdiv__": lambda: 2 / h(4, 8),
        "__rpow__": lambda: 2 ** h(4, 8),
        "__rtruediv__": lambda: 1.5 / h(4, 8),
        "acos": lambda: torch.acos(h(4, 8)),
        "asin": lambda: torch.asin(h(4, 8)),
        "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(h(4, 8), h(4, 8)),
        "cosh": lambda: torch.cosh(h(4, 8)),
        "cosine_embedding_loss": lambda: F.cosine_embedding_loss(h(4, 8), h(4, 8), torch.ones(4)),
        "cdist": lambda: torch.cdist(h(4, 8), h(3, 8)),
        "cosine_similarity": lambda: F.cosine_similarity(h(4, 8), h(4, 8)),
        "cross_entropy": lambda: F.cross_entropy(h(4, 8), idx),
        "cumprod": lambda: torch.cumprod(h(4, 8), 1),
        "cumsum": lambda: torch.cumsum(h(4, 8), 1),
        "dist": lambda: torch.dist(h(4, 8), h(4, 8)),
        "erfinv": lambda: torch.erfinv(h(4, 8)),
        "exp": lambda: torch.exp(h(4, 8)),
        "expm1": lambda: torch.expm1(h(4, 8)),
        "group_norm": lambda: F.group_norm(h(4, 8), 2),
        "hinge_embedding_loss": lambda: F.hinge_embedding_loss(h(4, 8), torch.ones(4, 8)),
        "kl_div": lambda: F.kl_div(h(4, 8), h(4, 8), reduction="batchmean"),
        "l1_loss": lambda: F.l1_loss(h(4, 8), h(4, 8)),
        "layer_norm": lambda: F.layer_norm(h(4, 8), (8,)),
        "log": lambda: torch.log(h(4, 8)),
        "log_softmax": lambda: F.log_softmax(h(4, 8), -1),
        "log10": lambda: torch.log10(h(4, 8)),
        "log1p": lambda: torch.log1p(h(4, 8)),
        "log2": lambda: torch.log2(h(4, 8)),
        "margin_ranking_loss": lambda: F.margin_ranking_loss(h(4), h(4), torch.ones(4)),
        "mse_loss": lambda: F.mse_loss(h(4, 8), h(4, 8)),
        "multilabel_margin_loss": lambda: F.multilabel_margin_loss(h(4, 8), torch.full((4, 8), -1)),
        "multi_margin_loss": lambda: F.multi_margin_loss(h(4, 8), idx),
        "nll_loss": lambda: F.nll_loss(h(4, 8), idx),
        "norm": lambda: torch.norm(h(4, 8)),
        "normalize": lambda: F.normalize(h(4, 8)),
        "pdist": lambda: F.pdist(h(4, 8)),
        "poisson_nll_loss": lambda: F.poisson_nll_loss(h(4, 8), h(4, 8)),
        "pow": lambda: torch.pow(h(4, 8), 3.0),
        "prod": lambda: torch.prod(h(4, 8)),
        "reciprocal": lambda: torch.reciprocal(h(4, 8)),
        "rsqrt": lambda: torch.rsqrt(h(4, 8)),
        "sinh": lambda: torch.sinh(h(4, 8)),
        "smooth_l1_loss": lambda: F.smooth_l1_loss(h(4, 8), h(4, 8)),
        "soft_margin_loss": lambda: F.soft_margin_loss(h(4, 8), torch.ones(4, 8)),
        "softmax": lambda: F.softmax(h(4, 8), -1),
        "softmin": lambda: F.softmin(h(4, 8), -1),
        "softplus": lambda: F.softplus(h(4, 8)),
        "sum": lambda: torch.sum(h(4, 8)),
        "renorm": lambda: torch.renorm(h(4, 8), 2, 0, 1.0),
        "tan": lambda: torch.tan(h(4, 8)),
        "triplet_margin_loss": lambda: F.triplet_margin_loss(h(4, 8), h(4, 8), h(4, 8)),
    }


# CUDA "ops that promote to the widest input type": one half and one float32 input -> float32;
# all-half inputs stay half.
def promote_ops(dt, wide):
    a = _half(dt)
    b = f32 if wide else _half(dt)
    idx = torch.tensor([0, 2])
    return {
        "addcdiv": lambda: torch.addcdiv(a(4, 8), a(4, 8), b(4, 8)),
        "addcmul": lambda: torch.addcmul(a(4, 8), a(4, 8), b(4, 8)),
        "atan2": lambda: torch.atan2(a(4, 8), b(4, 8)),
        "bilinear": lambda: F.bilinear(a(4, 8), a(4, 8), b(3, 8, 8)),
        "cross": lambda: torch.cross(a(4, 3), b(4, 3), dim=1),
        "dot": lambda: torch.dot(a(8), b(8)),
        "grid_sample": lambda: F.grid_sample(a(1, 1, 4, 4), b(1, 2, 2, 2), align_corners=False),
        "index_put": lambda: a(4, 8).index_put((idx,), b(2, 8)),
        "scatter_add": lambda: a(4, 8).scatter_add(0, torch.zeros(2, 8, dtype=torch.long), b(2, 8)),
        "tensordot": lambda: torch.tensordot(a(4, 8), b(8, 3), dims=1),
    }


def traced_dtype(make, dt, cuda=True):
    """The op's output dtype on fake CPU tensors, as the trace runs it (FakeTensorMode, autocast cpu)."""
    policy = cuda_autocast_policy() if cuda else torch.autocast("cpu", enabled=False)
    with policy, FakeTensorMode(allow_non_fake_inputs=True), torch.autocast("cpu", dtype=dt):
        return make().dtype


@pytest.mark.parametrize("dt", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(LOWER))
def test_lower_precision_list(name, dt):
    assert traced_dtype(LOWER[name], dt) == dt


@pytest.mark.parametrize("dt", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(fp32_ops(torch.float16)))
def test_float32_list(name, dt):
    assert traced_dtype(fp32_ops(dt)[name], dt) == torch.float32


@pytest.mark.parametrize("dt", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(promote_ops(torch.float16, True)))
def test_promote_list(name, dt):
    assert traced_dtype(promote_ops(dt, wide=True)[name], dt) == torch.float32
    assert traced_dtype(promote_ops(dt, wide=False)[name], dt) == dt


def test_cpu_autocast_alone_gets_the_cuda_float32_list_wrong():
    """Without the policy these run in half on CPU (what the trace counted before)."""
    ops = fp32_ops(torch.bfloat16)
    wrong = {
        n
        for n in ("softmax", "log_softmax", "layer_norm", "pow", "rsqrt", "exp", "sum", "cumsum", "group_norm")
        if traced_dtype(ops[n], torch.bfloat16, cuda=False) != torch.float32
    }
    assert wrong == {"softmax", "log_softmax", "layer_norm", "pow", "rsqrt", "exp", "sum", "cumsum", "group_norm"}


def test_every_op_torch_registers_for_cuda_autocast_has_a_policy_and_cpu_comes_back():
    assert unlisted_ops() == []  # every op torch 2.13 registers for AutocastCUDA is in the table
    changes = policy_changes()
    assert changes["softmax.int"] == "fp32_set_opt_dtype" and changes["native_layer_norm"] == "fp32"
    assert changes["cat"] == "fallthrough" and "linear" not in changes  # same policy: CPU's kernel and its cache
    with cuda_autocast_policy():
        pass
    assert traced_dtype(fp32_ops(torch.bfloat16)["softmax"], torch.bfloat16, cuda=False) == torch.bfloat16


def test_casts_are_recorded_for_backward():
    """The casts run above autograd, as CUDA's do: backward flows through them in the input dtype."""
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    with cuda_autocast_policy(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.softmax(x @ w, -1)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.shape == (8, 8)
