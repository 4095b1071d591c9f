"""The terms of a training step, each a formula with its source. Pure arithmetic.

Every function returns Terms in seconds for ONE device: `per` says whether the time is
paid per micro-batch or per optimizer step, `kind` how plan/estimate/step_time/model.py combines
it ("device": GPU work; "host": CPU time that overlaps device work; "link": collectives
that overlap compute; "serial": nothing overlaps it).

m = tokens per micro-batch on this device, P = matmul parameters of the decoder layers,
P_head = the output head's, T = trainable parameters, BW = datasheet memory bandwidth x
HBM_FRACTION, peak = the dtype's dense peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplan.plan.estimate.step_time import constants as K
from gpuplan.plan.estimate.step_time.shape import OPTIM_STATE_BYTES, StepShape, kernels_per_micro_batch

# Activation bytes per token per decoder layer in the forward, in elements of the compute
# dtype, counted from transformers' LlamaDecoderLayer: 2 RMSNorms (read + write h, 2 x 2h),
# rotary on q and k (read + write, 4h), 2 residual adds (read 2h + write h, 2 x 3h), SiLU x
# up (read 2f, write f). Backward reads and writes about twice that (each op's gradient
# reads its saved input and the incoming gradient and writes one).
ELEMENTWISE_H, ELEMENTWISE_F, BACKWARD_BYTES_RATIO = 14, 3, 2.0
# Logits and cross-entropy per token: transformers upcasts the [tokens, vocab] logits to
# fp32 (LlamaForCausalLM: logits.float()); log_softmax and nll_loss read and write them:
# ~16 bytes per vocabulary entry forward and as many backward.
LOGITS_BYTES_PER_VOCAB = 32
# Eager attention (transformers eager_attention_forward): the [b, heads, s, s] scores are
# written by QK^T, read and written by the fp32 softmax, read by PV: ~16 bytes per score
# forward, ~32 backward. Flash kernels keep them in SRAM (Dao et al. 2022).
EAGER_SCORE_BYTES_FWD, EAGER_SCORE_BYTES_BWD = 16, 32
# FlashAttention-2's backward runs 5 matmuls to the forward's 2 (Dao 2023, algorithm 2).
FLASH_BACKWARD_RATIO = 2.5


@dataclass(frozen=True)
class Term:
    name: str
    group: str  # "matmuls" | "attention" | "memory-bound" | "optimizer" | "fixed costs" | "communication" | "offload"
    seconds: float
    per: str  # "micro-batch" | "step"
    kind: str  # "device" | "host" | "link" | "serial"
    formula: str
    source: str = ""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "group": self.group,
            "seconds": self.seconds,
            "per": self.per,
            "kind": self.kind,
            "formula": self.formula,
            "source": self.source,
        }


def gemm_efficiency(c: K.ArchConstants, tokens: int) -> float:
    """Achievable fraction of the dense peak for GEMMs of `tokens` rows: eta x m / (m + M_HALF)."""
    return c.matmul_efficiency * tokens / (tokens + K.M_HALF_TOKENS)


def matmul_flops(s: StepShape) -> tuple[float, float, float]:
    """(forward, backward, recompute) matmul FLOPs of one micro-batch: 2mP per forward
    (Kaplan et al. 2020), backward 4mP, or 2mP with a frozen base (input gradients only),
    recompute 2mP of the layers (not the head) under checkpointing (Korthikanti et al. 2022)."""
    p = s.body_params + s.head_params
    fwd = 2 * s.tokens * p
    bwd = (2 if s.frozen_base else 4) * s.tokens * p
    rec = 2 * s.tokens * s.body_params if s.checkpointing else 0
    return fwd, bwd, rec


def matmul_terms(s: StepShape, c: K.ArchConstants, peak: float, bw: float) -> list[Term]:
    """Matmuls at eta(m) of the peak, against the weights they read (roofline per pass:
    a pass takes max(FLOPs / (eta(m) peak), weight bytes / BW), Williams et al. 2009)."""
    eta = gemm_efficiency(c, s.tokens)
    fwd, bwd, rec = matmul_flops(s)
    compute = (fwd + bwd + rec) / (eta * peak)
    p = s.body_params + s.head_params
    grads = 0 if s.frozen_base else p * s.grad_bytes  # the weight-gradient GEMM writes dW
    weights = p * s.weight_bytes * 2 + grads + (s.body_params * s.weight_bytes if s.checkpointing else 0)
    read = weights / bw
    out = [
        Term(
            "matmuls",
            "matmuls",
            compute,
            "micro-batch",
            "device",
            f"(2 + {2 if s.frozen_base else 4}{' + 2 recomputed' if s.checkpointing else ''}) x m x P FLOPs "
            f"at {eta:.0%} of peak (eta {c.matmul_efficiency:.0%} x m/(m + {K.M_HALF_TOKENS:.0f}))",
            c.source,
        )
    ]
    if read > compute:
        out.append(
            Term(
                "weight reads beyond the matmuls",
                "memory-bound",
                read - compute,
                "micro-batch",
                "device",
                "weights read per pass (forward, backward, recompute) / BW, above the matmul time: small m is bound by reading the weights",
                "roofline (Williams et al. 2009)",
            )
        )
    return out


def attention_terms(s: StepShape, c: K.ArchConstants, peak: float, bw: float) -> list[Term]:
    per_layer = 4 * s.batch * s.seq_len**2 * s.heads * s.head_dim  # QK^T and PV, full square
    passes = 2 if s.checkpointing else 1
    if s.attention == "flash":
        fwd = per_layer / 2  # causal: the kernel skips the masked half
        flops = s.layers * fwd * (passes + FLASH_BACKWARD_RATIO)
        t = flops / (gemm_efficiency(c, s.tokens) * K.FLASH_RELATIVE * peak)
        return [
            Term(
                "attention (flash, causal)",
                "attention",
                t,
                "micro-batch",
                "device",
                "2 b s^2 heads head_dim per layer forward (half of 4bs^2d: causal), backward 2.5x, "
                f"at {K.FLASH_RELATIVE:.0%} of the GEMM efficiency",
                "Dao 2023, FlashAttention-2",
            )
        ]
    flops = s.layers * per_layer * (passes + 2)
    scores = s.layers * s.batch * s.heads * s.seq_len**2
    traffic = scores * (EAGER_SCORE_BYTES_FWD * passes + EAGER_SCORE_BYTES_BWD)
    return [
        Term(
            "attention (eager)",
            "attention",
            flops / (gemm_efficiency(c, s.tokens) * peak),
            "micro-batch",
            "device",
            "4 b s^2 heads head_dim per layer forward, backward 2x",
            "PaLM appendix B",
        ),
        Term(
            "attention scores (eager)",
            "memory-bound",
            traffic / bw,
            "micro-batch",
            "device",
            "b heads s^2 scores x (16 B forward + 32 B backward) per layer / BW",
            "transformers eager attention",
        ),
    ]


def memory_terms(s: StepShape, bw: float) -> list[Term]:
    """Elementwise activations, LoRA's adapter ops, logits/CE, autocast casts, gradient
    accumulation and QLoRA's dequantization, per micro-batch, over the memory bandwidth."""
    passes = (2 if s.checkpointing else 1) + BACKWARD_BYTES_RATIO
    per_token = s.layers * (ELEMENTWISE_H * s.hidden + ELEMENTWISE_F * s.intermediate + s.adapter_io)
    out = [
        Term(
            "elementwise activations",
            "memory-bound",
            s.tokens * per_token * s.act_bytes * passes / bw,
            "micro-batch",
            "device",
            f"m x L x ({ELEMENTWISE_H}h + {ELEMENTWISE_F}f + adapter 2 in + 5 out) "
            "elements x bytes x (forward + recompute + 2 backward) / BW",
            "transformers LlamaDecoderLayer, peft",
        )
    ]
    if s.vocab:
        out.append(
            Term(
                "logits and cross-entropy",
                "memory-bound",
                s.tokens * s.vocab * LOGITS_BYTES_PER_VOCAB / bw,
                "micro-batch",
                "device",
                "m x vocab x 32 B (fp32 logits, log_softmax, nll; both passes) / BW",
                "transformers LlamaForCausalLM",
            )
        )
    p = s.body_params + s.head_params
    if s.autocast_cast:
        casts = (2 if s.checkpointing else 1) * (p - s.quantized_params) * 6
        out.append(
            Term(
                "autocast weight casts",
                "memory-bound",
                casts / bw,
                "micro-batch",
                "device",
                "fp32 weights cast to 16 bits per forward: 4 B read + 2 B write per weight",
                "torch.autocast",
            )
        )
    if not s.frozen_base:
        out.append(
            Term(
                "gradient accumulation",
                "memory-bound",
                p * 2 * s.grad_bytes / bw,
                "micro-batch",
                "device",
                "AccumulateGrad reads and writes each weight gradient",
                "torch autograd",
            )
        )
    if s.quantized_params:
        dq_passes = 3 if s.checkpointing else 2
        bytes_ = s.quantized_params * (0.5 + 2) * dq_passes
        out.append(
            Term(
                "4-bit dequantization",
                "memory-bound",
                bytes_ / (bw / K.HBM_FRACTION * K.DEQUANT_BW_FRACTION),
                "micro-batch",
                "device",
                f"4-bit read + 16-bit write per weight, {dq_passes} passes, at {K.DEQUANT_BW_FRACTION:.0%} of the bandwidth",
                "bitsandbytes MatMul4Bit; " + K.FIT_SOURCE,
            )
        )
    return out


def optimizer_terms(s: StepShape, bw: float, shards: int, host_bw: float | None) -> list[Term]:
    """The optimizer step over the trainable parameters only (this rank's shard), and the
    gradient clipping (Trainer max_grad_norm) before it; zero_grad(set_to_none) is free."""
    t = s.trainable_params / max(shards, 1)
    pb = 4 if s.frozen_base else s.stored_weight_bytes
    state = OPTIM_STATE_BYTES.get(s.optim, 8)
    per_param = 2 * pb + s.grad_bytes + 2 * state
    where, speed = ("on the CPU (offloaded)", host_bw) if host_bw else ("", bw)
    return [
        Term(
            "optimizer step",
            "optimizer",
            t * per_param / speed,
            "step",
            "serial",
            f"T x (read + write param {pb} B, read grad {s.grad_bytes} B, read + write states {state} B) / BW " + where,
            "torch.optim foreach AdamW: one pass over params, grads and moments",
        ),
        Term(
            "gradient clipping",
            "optimizer",
            t * 3 * s.grad_bytes / bw,
            "step",
            "serial",
            "norm (read) and scale (read + write) of every gradient",
            "torch.nn.utils.clip_grad_norm_",
        ),
    ]


def fixed_terms(s: StepShape, c: K.ArchConstants, zero3: bool) -> list[Term]:
    kernels = kernels_per_micro_batch(s)
    out = [
        Term(
            "kernel launches",
            "fixed costs",
            kernels * c.kernel_s,
            "micro-batch",
            "host",
            f"{kernels:,} kernels per micro-batch x {c.kernel_s * 1e6:.0f} us",
            c.source,
        ),
        Term(
            "Trainer and dataloader",
            "fixed costs",
            K.TRAINER_STEP_S,
            "step",
            "serial",
            f"{K.TRAINER_STEP_S * 1000:.0f} ms per optimizer step",
            K.FIT_SOURCE,
        ),
    ]
    if zero3:
        passes = 3 if s.checkpointing else 2
        out.append(
            Term(
                "ZeRO-3 parameter hooks",
                "fixed costs",
                s.param_tensors * passes * K.ZERO3_HOOK_S,
                "micro-batch",
                "serial",
                f"{s.param_tensors} parameter tensors x {passes} passes x {K.ZERO3_HOOK_S * 1e6:.0f} us",
                K.FIT_SOURCE,
            )
        )
    return out
