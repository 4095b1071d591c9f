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
from gpuplan.plan.estimate.step_time import shape as S
from gpuplan.plan.estimate.step_time.shape import OPTIM_STATE_BYTES, StepShape, checkpoint_host_kernels, kernels_per_micro_batch

# Activation bytes per token per decoder layer in the forward, in elements of the compute
# dtype, counted from transformers' LlamaDecoderLayer: 2 RMSNorms (read + write h, 2 x 2h),
# rotary on q and k (read + write, 4h), 2 residual adds (read 2h + write h, 2 x 3h), SiLU x
# up (read 2f, write f). Backward reads and writes about twice that (each op's gradient
# reads its saved input and the incoming gradient and writes one).
ELEMENTWISE_H, ELEMENTWISE_F, BACKWARD_BYTES_RATIO = 14, 3, 2.0
# The same work as eager transformers runs it, every op a kernel of its own that reads and writes memory: bytes per
# token a Llama-family layer (RMSNorm, rotary, gated MLP) moves outside its GEMMs and attention kernel, per hidden and
# per intermediate element, ((forward h, f), (backward h, f)), by the residual stream's dtype (shape.layer_stream):
# RMSNorm's fp32 upcast, square, mean, rsqrt, multiplies and cast back, rotary's slices, neg, cat and multiplies, the
# residual adds, SiLU x up, autocast's casts of an fp32 stream before every linear, and their gradients. Traced on
# torch 2.13 and transformers 5.25 (benchmarks/layer_traffic.py, benchmarks/data/layer_traffic.json). The hand count
# above stands for a run whose kernels are fused (shape.LAYER_KERNELS: Liger, torch.compile, flash-attn's RMSNorm
# and rotary), for the families not traced, and on a CPU (shape.eager_stream): a CPU plan's activations (a few MB for the models a CPU
# trains) stay in its caches between ops, which the probed DRAM copy bandwidth does not price. The README's tiny CPU
# apply cannot tell the two apart on this shared machine: 0.93x and 1.59x of the traced bytes' plan in two runs (the
# probe's bandwidth moved between them), 0.86x of the hand count's; CPU plans stay as they were.
EAGER_LLAMA_BYTES = {
    "bf16": ((134, 10), (288, 18)),
    "amp": ((194, 10), (414, 18)),
    "fp32": ((180, 20), (384, 36)),
}
# ... the backward (h, f) of a layer whose weights are frozen (a LoRA or QLoRA base): the input gradients alone, no
# norm weight's gradient (its multiply by the normalized input, its sum over the tokens, an fp32 stream's casts of
# it). Traced the same way, every weight frozen and the embedding's output requiring a gradient, as peft leaves it.
EAGER_LLAMA_FROZEN_BACKWARD = {"bf16": (272, 18), "amp": (382, 18), "fp32": (352, 36)}
# Logits and cross-entropy per token: transformers upcasts the [tokens, vocab] logits to
# fp32 (LlamaForCausalLM: logits.float()); log_softmax and nll_loss read and write them:
# ~16 bytes per vocabulary entry forward and as many backward.
LOGITS_BYTES_PER_VOCAB = 32
# gelu_new (shape.GELU_NEW_MODELS): 8 eager kernels over the [tokens, f] activation (pow, 2 mul,
# add, tanh, add, 2 mul: ~18 f elements read + written) where a fused activation moves ~3 f.
GELU_NEW_F = 15
# Residual dropout: 2 per layer, each reads and writes h elements and writes a 1-byte mask
# (torch native_dropout): ~5 h elements at 2 bytes.
HIDDEN_DROPOUT_H = 5


def eager_score_bytes(act: int, dropout: bool) -> tuple[int, int]:
    """Bytes per attention score, forward and backward, of transformers' eager_attention_forward
    (models/llama, models/gpt2): QK^T writes the scores (a B each, the compute dtype); `* scaling`
    and `+ mask` read and write them; softmax runs in fp32 (softmax(dtype=float32), or autocast's
    fp32 softmax) and writes 4 B; the cast back reads 4 and writes a; dropout reads a, writes a and
    a 1-byte mask; PV reads a. Backward: PV's writes dP and reads P, dropout's, the cast's, softmax's
    (reads the fp32 output and gradient, writes one), the scaling's, and QK^T's read. Flash kernels
    keep the scores in SRAM (Dao et al. 2022). bf16: 29 B forward, 33 backward with dropout."""
    cast = act < 4
    a = act
    fwd = a + 2 * a + 2 * a + (a + 4) + ((4 + a) if cast else 0) + ((2 * a + 1) if dropout else 0) + a
    bwd = 2 * a + ((2 * a + 1) if dropout else 0) + ((a + 4) if cast else 0) + 12 + 2 * a + a
    return fwd, bwd


# The matmul term of the saved modules' weight gradients: a backward-only GEMM (plan/estimate/throughput.py
# nograd_forward_terms leaves it out of a forward's share).
SAVED_GRADIENTS = "saved modules' weight gradients"
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


def gemm_efficiency(c: K.ArchConstants, tokens: int, width: int = K.GEMM_REFERENCE_WIDTH) -> float:
    """Achievable fraction of the dense peak for GEMMs of `tokens` rows and `width` output columns:
    eta x mN / (mN + M_HALF x REFERENCE_WIDTH). What fills the GPU is the number of output tiles,
    ceil(M / tile_M) x ceil(N / tile_N), against the SMs ("tile quantization" and "wave
    quantization", NVIDIA Matrix Multiplication Background User's Guide): a GEMM's output of m x N
    elements, not its m alone, so a narrow model (N = hidden 2048) needs twice the tokens of a
    4096-wide one to fill the same waves. M_HALF_TOKENS is the half-saturation m at N = 4096."""
    if c.name == "cpu":  # tiles over SMs is a GPU's matter: a CPU's rate is its measured matmul's (constants.CPU)
        width = K.GEMM_REFERENCE_WIDTH
    elements = tokens * max(width, 1)
    return c.matmul_efficiency * elements / (elements + K.M_HALF_TOKENS * K.GEMM_REFERENCE_WIDTH)


def matmul_flops(s: StepShape) -> tuple[float, float, float]:
    """(forward, backward, recompute) matmul FLOPs of one micro-batch: 2mP per forward
    (Kaplan et al. 2020), backward 4mP, or 2mP with a frozen base (input gradients only; the saved
    linears' weight gradients are matmul_terms' term of their own), recompute 2mP of the layers (not
    the head) under checkpointing (Korthikanti et al. 2022)."""
    p = s.body_params + s.head_params
    fwd = 2 * s.tokens * p
    bwd = (2 if s.frozen_base else 4) * s.tokens * p
    rec = 2 * s.tokens * s.body_params if s.checkpointing else 0
    return fwd, bwd, rec


def matmul_terms(s: StepShape, c: K.ArchConstants, peak: float, bw: float) -> list[Term]:
    """Matmuls at eta(m) of the peak, against the weights they read (roofline per pass:
    a pass takes max(FLOPs / (eta(m) peak), weight bytes / BW), Williams et al. 2009)."""
    eta = gemm_efficiency(c, s.tokens, s.hidden)  # the layers' GEMMs: q, o and down write m x hidden
    fwd, bwd, rec = matmul_flops(s)
    # the saved linears' dW (set only under a frozen base: build_shape): 2 FLOPs a weight a token
    saved, saved_head = 2 * s.tokens * s.saved_linear_params, 2 * s.tokens * s.saved_head_params
    p = s.body_params + s.head_params
    compute = (fwd + bwd + rec) / (eta * peak)
    if s.head_params and s.vocab:  # the head writes m x vocab: it fills the GPU at far fewer tokens
        head = (fwd + bwd) * s.head_params / p
        compute += head / (gemm_efficiency(c, s.tokens, s.vocab) * peak) - head / (eta * peak)
    # a saved head's dW is vocab x hidden: priced as the head's GEMMs; another saved linear's as the layers'
    saved_s = saved_head / (gemm_efficiency(c, s.tokens, s.vocab or s.hidden) * peak) + (saved - saved_head) / (eta * peak)
    # the weight-gradient GEMMs write dW: every weight's, or the saved copies' in their own dtype
    grads = s.saved_linear_params * s.saved_grad_bytes if s.frozen_base else p * s.grad_bytes
    weights = p * s.weight_bytes * 2 + grads + (s.body_params * s.weight_bytes if s.checkpointing else 0)
    read = weights / bw  # against the whole GEMM time: the saved dW's too
    out = [
        Term(
            "matmuls",
            "matmuls",
            compute,
            "micro-batch",
            "device",
            f"(2 + {2 if s.frozen_base else 4}{' + 2 recomputed' if s.checkpointing else ''}) x m x P FLOPs "
            f"at {eta:.0%} of peak (eta {c.matmul_efficiency:.0%} x mh/(mh + {K.M_HALF_TOKENS:.0f} x {K.GEMM_REFERENCE_WIDTH}), "
            f"h {s.hidden:,})",
            c.source,
        )
    ]
    if saved:
        out.append(
            Term(
                SAVED_GRADIENTS,
                "matmuls",
                saved_s,
                "micro-batch",
                "device",
                f"2 x m x {s.saved_linear_params:,} FLOPs: the weight gradients of the modules_to_save copies (a frozen "
                "base's other linears compute none), a saved head's at the head's rate",
                "peft ModulesToSaveWrapper: the copies train in full",
            )
        )
    compute += saved_s
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
        t = flops / (gemm_efficiency(c, s.tokens, s.hidden) * c.flash_relative * peak)
        return [
            Term(
                "attention (flash, causal)",
                "attention",
                t,
                "micro-batch",
                "device",
                "2 b s^2 heads head_dim per layer forward (half of 4bs^2d: causal), backward 2.5x, "
                f"at {c.flash_relative:.0%} of the GEMM efficiency",
                "Dao 2023, FlashAttention-2",
            )
        ]
    flops = s.layers * per_layer * (passes + 2)
    scores = s.layers * s.batch * s.heads * s.seq_len**2
    score_fwd, score_bwd = eager_score_bytes(s.act_bytes, s.attention_dropout > 0)
    traffic = scores * (score_fwd * passes + score_bwd)
    return [
        Term(
            "attention (eager)",
            "attention",
            flops / (gemm_efficiency(c, s.tokens, s.hidden) * peak),
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
            f"b heads s^2 scores x ({score_fwd} B forward + {score_bwd} B backward) per layer / BW",
            "transformers eager_attention_forward: scale, mask, fp32 softmax, cast, dropout",
        ),
    ]


def memory_terms(s: StepShape, bw: float) -> list[Term]:
    """Elementwise activations, LoRA's adapter ops, logits/CE, autocast casts, gradient
    accumulation and QLoRA's dequantization, per micro-batch, over the memory bandwidth."""
    forwards = 2 if s.checkpointing else 1
    passes = forwards + BACKWARD_BYTES_RATIO
    per_layer_h = ELEMENTWISE_H + (HIDDEN_DROPOUT_H if s.hidden_dropout > 0 else 0)
    per_layer_f = ELEMENTWISE_F + (GELU_NEW_F if s.gelu_new else 0)
    adapters = s.layers * (s.adapter_fwd_bytes * forwards + s.adapter_bwd_bytes)
    if s.eager_stream:
        (fh, ff), (bh, bf) = EAGER_LLAMA_BYTES[s.eager_stream]
        if s.frozen_base:
            bh, bf = EAGER_LLAMA_FROZEN_BACKWARD[s.eager_stream]
        per_token: float = s.layers * ((fh * s.hidden + ff * s.intermediate) * forwards + bh * s.hidden + bf * s.intermediate)
        formula = (
            f"m x L x (({fh}h + {ff}f) B x {forwards} forward + ({bh}h + {bf}f) B backward) / BW "
            f"(eager kernels, {s.eager_stream} residual stream{', frozen weights' if s.frozen_base else ''})"
        )
        source = "transformers LlamaDecoderLayer run eagerly, traced (benchmarks/layer_traffic.py)"
    else:
        per_token = s.layers * (per_layer_h * s.hidden + per_layer_f * s.intermediate) * s.act_bytes * passes
        formula = f"m x L x ({per_layer_h}h + {per_layer_f}f) elements x bytes x (forward + recompute + 2 backward) / BW"
        source = "transformers LlamaDecoderLayer's reads and writes as fused kernels; GPT-2's gelu_new and residual dropout"
    out = [Term("elementwise activations", "memory-bound", s.tokens * per_token / bw, "micro-batch", "device", formula, source)]
    if adapters:
        out.append(
            Term(
                "LoRA adapter path",
                "memory-bound",
                s.tokens * adapters / bw,
                "micro-batch",
                "device",
                f"m x L x ({s.adapter_fwd_bytes:,.0f} B forward{' x 2 (recompute)' if forwards == 2 else ''} + "
                f"{s.adapter_bwd_bytes:,.0f} B backward) per token / BW",
                "peft LoRA Linear.forward: cast, dropout, A, B, scaling, add, cast back (shape.ADAPTER_BYTES, traced)",
            )
        )
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
    if not s.frozen_base or s.saved_params:
        out.append(
            Term(
                "gradient accumulation",
                "memory-bound",
                (s.saved_params * s.saved_grad_bytes if s.frozen_base else p * s.grad_bytes) * 2 / bw,
                "micro-batch",
                "device",
                "AccumulateGrad reads and writes each weight gradient" + (" of the saved modules" if s.frozen_base else ""),
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


def fixed_terms(s: StepShape, c: K.ArchConstants, shards: int = 1, zero_stage: int = 0) -> list[Term]:
    """Kernel launches and checkpointing's own host work (host, overlapping the device), the Trainer's per-step work (serial) and
    DeepSpeed's ZeRO hooks (`zero_stage`: the DeepSpeed stage, 0 without DeepSpeed). ZeRO-3's
    per-parameter hooks are host work too; with parameters sharded over more than one rank each
    module's fetch blocks the host on its in-flight all-gather
    (deepspeed/runtime/zero/partitioned_param_coordinator.py fetch_sub_module: the fetch-event
    back-pressure `synchronize()` and the handle's wait, for a parameter in the in-flight
    registry), so they add to the step; on one rank no fetch waits on another rank's shard and the
    host runs ahead of the device as it does for kernel launches (the Qwen README's 1-GPU ZeRO-3
    rows: 2.1-2.3 s/it from 256 to 2,048 tokens, then the device's time). `zero_stage` 2 (DeepSpeed):
    each trainable parameter's backward hook copies its gradient into the reduce bucket
    (deepspeed/runtime/zero/stage_1_and_2.py reduce_ready_partitions_and_remove_grads), host work
    beside the device's as the launches are (stage 1 reduces once per step: not priced, constants.py)."""
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
    ]
    ckpt = checkpoint_host_kernels(s)
    if ckpt:
        layer, adapter = S.CHECKPOINT_HOST_KERNELS[S.CHECKPOINT_MODE]
        per = f"{layer:g}" + (f" + {s.adapters_per_layer} adapters x {adapter:g}" if s.adapters_per_layer else "")
        out.append(
            Term(
                "checkpointing's host work",
                "fixed costs",
                ckpt * c.kernel_s,
                "micro-batch",
                "host",
                f"{s.layers} checkpointed layers x ({per}) kernel launches' worth x {c.kernel_s * 1e6:.0f} us "
                f"(torch.utils.checkpoint, {S.CHECKPOINT_MODE})",
                "measured: benchmarks/host_overhead.py (its own host work against the launches)",
            )
        )
    trainer, trainer_source = c.trainer_step()
    out += [
        Term(
            "Trainer and dataloader",
            "fixed costs",
            trainer,
            "step",
            "serial",
            f"{trainer * 1000:.{0 if trainer >= 0.01 else 1}f} ms per optimizer step",
            trainer_source,
        ),
    ]
    if zero_stage == 3:
        passes = 3 if s.checkpointing else 2
        out.append(
            Term(
                "ZeRO-3 parameter hooks",
                "fixed costs",
                s.zero3_tensors * passes * K.ZERO3_HOOK_S,
                "micro-batch",
                "serial" if shards > 1 else "host",
                f"{s.zero3_tensors} parameter tensors x {passes} passes x {K.ZERO3_HOOK_S * 1e6:.0f} us"
                + (", blocking on the all-gathers" if shards > 1 else ", overlapping the device (one rank: no fetch waits on another)"),
                K.FIT_SOURCE,
            )
        )
    elif zero_stage == 2:
        out.append(
            Term(
                "ZeRO-2 gradient hooks",
                "fixed costs",
                s.trainable_tensors * K.ZERO2_HOOK_S,
                "micro-batch",
                "host",
                f"{s.trainable_tensors} trainable tensors x {K.ZERO2_HOOK_S * 1e6:.0f} us",
                K.ZERO2_HOOK_SOURCE,
            )
        )
    return out
