"""What one device does in one micro-batch and one optimizer step, as counts the terms price.

Pure: from ModelFacts, a Workload and a GPUProfile. Kernels per decoder layer were counted
with torch.profiler (top-level aten ops that launch work, views left out) on transformers
5.x LlamaForCausalLM with SDPA, CPU, 4 vs 8 layers: 44 per layer in the forward, 86 in the
backward (1.95x), 26 for the embedding, final norm, head and loss in the forward. A peft
LoRA adapter adds dropout, two thin matmuls, the scaling and the add (peft/tuners/lora/
layer.py Linear.forward): 5 kernels forward, 10 backward. A bitsandbytes 4-bit linear
dequantizes its weight before the matmul (bitsandbytes/autograd/_functions.py MatMul4Bit,
forward and backward): 2 more per pass. benchmarks/kernel_counts.py recounts them on the installed
stack (benchmarks/RESULTS.md, "Kernels per decoder layer, counted"): transformers 5.25 launches 36
forward and 69 backward a layer, 4 + 4 more with bf16 weights (RMSNorm's casts), and, composed as
below, 6 + 9.4 per fp32 adapter over a bf16 base under autocast. The constants below are what
KERNEL_S was fitted with (benchmarks/fit_step_time.py); changing them moves that fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.plan.estimate.memory.states import DTYPE_BYTES
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.methods import method_of

LAYER_KERNELS_FWD = 44
BACKWARD_KERNEL_RATIO = 1.95
ADAPTER_KERNELS_FWD, ADAPTER_KERNELS_BWD = 5, 10
# The bytes a LoRA adapter moves beside its frozen linear, per element of the linear's input (fan_in) and output
# (fan_out) and per pass: the cast of x to the adapter's dtype, dropout (its own entry: added to the input's bytes
# when lora_dropout > 0), lora_A's read of its input, lora_B's output, the scaling, the add to the frozen output
# and the cast back (peft/tuners/lora/layer.py Linear.forward), and their gradients, the input gradient's add to
# the frozen linear's included. By the dtypes the path runs in (adapter_mode). Traced on torch 2.13 and peft 0.21
# with a TorchDispatchMode, the frozen linear's own bytes subtracted, dropout as CUDA's fused native_dropout (bool
# mask): benchmarks/adapter_traffic.py, benchmarks/data/adapter_traffic.json (r-sized intermediates, ~0.1 B, left
# out). Before these the model priced every path at 2 fan_in + 5 fan_out elements of the activation's dtype.
ADAPTER_BYTES: dict[str, dict[str, tuple[int, int]]] = {
    # fp32 base, fp32 adapters, no autocast
    "fp32": {"forward": (4, 24), "backward": (20, 16), "dropout": (9, 9)},
    # fp32 activations under 16-bit autocast (an fp32 base, or QLoRA's kbit preparation): the thin matmuls cast x
    "amp": {"forward": (8, 12), "backward": (22, 8), "dropout": (9, 9)},
    # a 16-bit base, fp32 adapters (peft >= 0.12 autocast_adapter_dtype), no autocast: the whole path in fp32
    "half": {"forward": (10, 28), "backward": (20, 28), "dropout": (9, 9)},
    # a 16-bit base, fp32 adapters, 16-bit autocast: x cast to fp32 by peft, back to 16-bit by autocast
    "half-amp": {"forward": (14, 12), "backward": (22, 8), "dropout": (9, 9)},
    # adapters in the 16-bit base's dtype (peft < 0.12, or an engine that gathers 16-bit parameters): no casts
    "16-bit": {"forward": (2, 12), "backward": (10, 8), "dropout": (5, 5)},
}
# peft >= 0.12 keeps LoRA adapters in fp32 over a 16-bit base (get_peft_model(autocast_adapter_dtype=True)), as
# gpuplan's apply trains them; benchmarks/published_rows.py plans runs of an older peft, which made the adapters in
# the base weight's dtype, with False.
ADAPTER_UPCAST = True
# How a run's decoder layers execute their elementwise work: "eager" (transformers as written, every op a kernel:
# gpuplan's apply without Liger, the default) or "fused" (Liger's kernels, torch.compile, flash-attn's RMSNorm and
# rotary). terms.memory_terms prices eager Llama-family layers by the traced EAGER_LLAMA_BYTES, fused ones by the hand
# count; benchmarks/published_rows.py sets it by what each source ran.
LAYER_KERNELS = "eager"
DEQUANT_KERNELS = 2
# Eager attention (transformers eager_attention_forward, models/llama and models/gpt2): QK^T,
# the scaling, the mask add, softmax, the cast back from fp32 softmax, PV: 6 kernels where SDPA
# runs 1 (the 44 above were profiled with SDPA), and dropout on the probabilities when
# attention_dropout > 0 (torch.nn.functional.dropout, one fused kernel); backward ~2x each.
EAGER_ATTENTION_KERNELS_FWD = 5
# gelu_new, the default activation of GPT-2, GPT-J, GPT-Neo, CodeGen and Phi configs
# (activation_function / hidden_act "gelu_new"; transformers activations.py NewGELUActivation:
# 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))): 8 eager kernels where a
# SiLU or torch GELU is 1. ModelFacts carries no activation, so their model_type stands for it.
GELU_NEW_KERNELS_FWD = 7
GELU_NEW_MODELS = frozenset({"gpt2", "gptj", "phi", "codegen", "gpt_neo"})
# Residual / embedding dropout (GPT-2 resid_pdrop, embd_pdrop): 2 per layer, one fused kernel each.
HIDDEN_DROPOUTS_PER_LAYER = 2
HEAD_KERNELS = 26  # embedding, final norm, lm_head, fp32 upcast, cross-entropy, forward (profiled); ~ as many backward
# Activation checkpointing's own host work per checkpointed layer and micro-batch, beyond the kernels it recomputes:
# torch.utils.checkpoint's Python around them (the reentrant form saves and restores the RNG state and runs a nested
# backward; the non-reentrant form packs and unpacks every saved tensor through hooks, more of them with each LoRA
# adapter). In kernel launches' worth of host time, [per layer, per LoRA adapter in it], so that KERNEL_S prices it as
# it prices the launches: measured against the same model's launches without checkpointing, on one CPU core
# (benchmarks/host_overhead.py, benchmarks/data/host_overhead.json "checkpoint_host_kernels"; a GPU host's run of it,
# host_overhead-cuda.json, replaces these with KERNEL_S's prior, tests/plan/test_step_time.py). transformers 5 and
# gpuplan's apply checkpoint non-reentrantly; transformers 4's Trainer ran the reentrant form (benchmarks/
# published_rows.py plans its rows with it).
CHECKPOINT_HOST_KERNELS = {"reentrant": (65.3, 5.4), "non-reentrant": (163.7, 21.6)}
CHECKPOINT_MODE = "non-reentrant"

BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
OPTIM_STATE_BYTES = {  # bytes of optimizer state per trainable parameter (two moments for Adam)
    "adamw_torch": 8,
    "adamw_torch_fused": 8,
    "adamw_hf": 8,
    "adamw_apex_fused": 8,
    "adafactor": 0,
    "adamw_bnb_8bit": 2,
    "adamw_8bit": 2,
    "paged_adamw_8bit": 2,
    "paged_adamw_32bit": 8,
    "sgd": 0,
}


@dataclass(frozen=True)
class StepShape:
    """Counts for one device. Tokens per micro-batch m = batch x seq_len."""

    tokens: int  # per micro-batch, this device
    seq_len: int
    batch: int
    accumulation: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    head_dim: int
    vocab: int
    body_params: int  # matmul parameters in the decoder layers (active ones for MoE)
    head_params: int  # the output head's matmul parameters (0 without an LM head)
    n_params: int
    trainable_params: int
    frozen_base: bool
    quantized_params: int  # 4-bit linear weights (QLoRA)
    adapters_per_layer: int
    adapter_fwd_bytes: float  # bytes per token one layer's adapters move in a forward (ADAPTER_BYTES)
    adapter_bwd_bytes: float  # ... in a backward
    linears_per_layer: int
    compute_dtype: str
    act_bytes: int  # bytes per activation element in the compute dtype
    weight_bytes: float  # bytes per weight the matmuls read (the compute-dtype copy)
    stored_weight_bytes: float  # bytes per weight as stored (4-bit: 0.5)
    grad_bytes: int  # bytes per trainable gradient element
    autocast_cast: bool  # fp32 weights under bf16/fp16 autocast: cast every forward
    optim: str
    checkpointing: bool
    attention: str  # "flash" | "eager"
    on_cpu: bool
    # DeepSpeed ZeRO's hooks (terms.fixed_terms): stage 3 hooks every parameter tensor, the adapters' included
    # (DeepSpeed partitions every parameter of the module tree; benchmarks/zero_overhead.py measures the same host
    # cost per tensor for full and LoRA only when they are counted); stage 2 the trainable ones.
    zero3_tensors: int = 0
    trainable_tensors: int = 0
    # modules_to_save under a frozen base (peft's ModulesToSaveWrapper): trained in full, so their gradients are
    # accumulated, and a saved linear (a trainable lm_head or classifier) runs its weight-gradient GEMM. The copies keep
    # the base's dtype (fp32 under QLoRA, whose kbit preparation upcasts them): memory/adapters.py _frozen_base.
    saved_params: int = 0
    saved_linear_params: int = 0  # the saved linears' weights, the output head's (saved_head_params) among them
    saved_head_params: int = 0
    saved_grad_bytes: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    gelu_new: bool = False  # the composite tanh GELU (GELU_NEW_MODELS): 8 elementwise kernels
    # the residual stream's dtype (layer_stream) where terms.EAGER_LLAMA_BYTES prices the layers' elementwise work:
    # eager (LAYER_KERNELS, no Liger) Llama-family layers on a GPU; None: the hand count (eager_stream says why)
    eager_stream: str | None = None


class _AdapterCounts(NamedTuple):
    trainable: int  # the adapters' parameters and the saved modules' copies
    per_layer: int  # adapters per decoder layer
    fan_in: int  # the adapted linears' inputs in one layer, summed
    fan_out: int  # ... and their outputs
    tensors: int  # A and B, DoRA's magnitudes and the saved copies, as memory/adapters.py adapter_layout lists them
    saved: int  # the saved modules' parameters
    saved_linear: int  # of those, the saved linears' weights, whose weight-gradient GEMM runs
    saved_head: int  # of those, the output head's


@lru_cache(maxsize=512)
def _adapter_counts(facts: ModelFacts, adapters: Adapters) -> _AdapterCounts:
    """What a LoRA run trains and launches beside the frozen base, as StepShape counts it."""
    from gpuplan.modelinfo.lora_targets import saved_modules
    from gpuplan.plan.estimate.memory.adapters import adapter_layout, lora_candidates, peft_matches

    lay = adapter_layout(facts, adapters)
    adapted = [
        (fan_in, fan_out)
        for name, _, fan_in, fan_out in lora_candidates(facts, list(adapters.modules_to_save), adapters.excluded_modules)
        if any(peft_matches(name, t) for t in adapters.target_modules)
    ]
    layers = max(facts.num_layers, 1)
    linears = {name: fan_in * fan_out for name, _, fan_in, fan_out in facts.linear_layers}
    if facts.task == "causal-lm":  # the output head (not among the LoRA candidates; tied or not, a saved copy is its own)
        linears.setdefault("lm_head", facts.vocab_size * facts.hidden_size)
    saved = [
        (name, w)
        for m in saved_modules(facts, list(adapters.modules_to_save))
        for name, w in linears.items()
        if name == m or name.startswith(m + ".")
    ]
    return _AdapterCounts(
        trainable=lay.adapter_params + lay.saved_params,
        per_layer=lay.targets_per_layer,
        fan_in=sum(i for i, _ in adapted) // layers,
        fan_out=sum(o for _, o in adapted) // layers,
        tensors=len(lay.adapter_shapes),
        saved=lay.saved_params,
        saved_linear=sum(w for _, w in saved),
        saved_head=sum(w for name, w in saved if name == "lm_head"),
    )


def adapter_mode(wl: Workload) -> str:
    """The dtypes a LoRA adapter's path runs in, an ADAPTER_BYTES key: an engine that gathers 16-bit parameters
    (FSDP's param_dtype, DeepSpeed's bf16/fp16) runs the adapters in 16 bits, as do a peft < 0.12 run's adapters
    over a 16-bit LoRA base or a FSDP QLoRA base (its 4-bit weights stored in the 16-bit quant_storage); otherwise the
    adapters are fp32 and the input reaches them in the base's dtype, fp32 for QLoRA (prepare_model_for_kbit_training
    upcasts the norms, so the residual stream is fp32: memory/lora_activations.py lora_mode)."""
    a = wl.adapters
    sixteen = wl.weight_dtype in ("bfloat16", "float16") and a is not None and not method_of(a).quantized_base
    sharded = wl.engine in ("fsdp", "deepspeed")
    if (sharded and wl.amp is not None) or (not ADAPTER_UPCAST and (sixteen or sharded)):
        return "16-bit"
    if sixteen:
        return "half-amp" if wl.amp is not None else "half"
    return "amp" if wl.amp is not None else "fp32"


def layer_stream(wl: Workload, act_bytes: int) -> str:
    """The residual stream's dtype, a terms.EAGER_LLAMA_BYTES key: fp32 compute; fp32 under 16-bit autocast where
    the weights are fp32 or QLoRA's kbit preparation upcast the norms and embeddings, unless an engine gathers 16-bit
    parameters; otherwise 16-bit."""
    if act_bytes >= 4:
        return "fp32"
    quantized = wl.adapters is not None and method_of(wl.adapters).quantized_base
    sharded = wl.engine in ("fsdp", "deepspeed")
    if wl.amp is not None and not sharded and (wl.weight_dtype == "float32" or quantized):
        return "amp"
    return "bf16"


def eager_stream(facts: ModelFacts, wl: Workload, act_bytes: int, on_cpu: bool) -> str | None:
    """layer_stream where the traced eager bytes price a layer (terms.EAGER_LLAMA_BYTES), None where the hand count
    does: a run whose kernels are fused (LAYER_KERNELS, Liger), a layer the trace does not stand for (not RMSNorm with a
    gated MLP, as a VLM's Qwen2 language model is; modelinfo's LLAMA_LIKE names counting families and leaves such
    backbones out), and a CPU, whose small activations stay in its caches between ops, which its probed DRAM copy
    bandwidth does not price (terms.EAGER_LLAMA_BYTES)."""
    llama_layer = facts.norm == "rmsnorm" and facts.mlp == "gated"
    if LAYER_KERNELS != "eager" or wl.liger_kernel or on_cpu or not llama_layer:
        return None
    return layer_stream(wl, act_bytes)


def adapter_bytes(wl: Workload, fan_in: int, fan_out: int) -> tuple[float, float]:
    """(forward, backward) bytes per token one layer's adapters move (ADAPTER_BYTES), fan_in and fan_out summed over
    its adapted linears."""
    if wl.adapters is None or not fan_in:
        return 0.0, 0.0
    c = ADAPTER_BYTES[adapter_mode(wl)]
    drop = c["dropout"] if wl.adapters.lora_dropout > 0 else (0, 0)
    fwd = (c["forward"][0] + drop[0]) * fan_in + c["forward"][1] * fan_out
    bwd = (c["backward"][0] + drop[1]) * fan_in + c["backward"][1] * fan_out
    return float(fwd), float(bwd)


def saved_linear_params(facts: ModelFacts, adapters: Adapters | None) -> int:
    """The weights of the linears a LoRA run trains in full (modules_to_save: a saved head, a classifier), whose
    weight-gradient GEMMs run beside the frozen base's input gradients (0 without adapters or saved modules)."""
    if adapters is None or not adapters.modules_to_save or not method_of(adapters).frozen_base:
        return 0
    return _adapter_counts(facts, adapters).saved_linear


def build_shape(facts: ModelFacts, wl: Workload, gpu: GPUProfile, compute_dtype: str) -> StepShape:
    from gpuplan.plan.estimate.flops import matmul_params  # the 6N term's N, one definition

    n, head = matmul_params(facts)
    method = method_of(wl.adapters)
    frozen = method.frozen_base
    counts = _AdapterCounts(facts.n_params, 0, 0, 0, 0, 0, 0, 0)
    quantized = 0
    if frozen and wl.adapters is not None:
        counts = _adapter_counts(facts, wl.adapters)
        if method.quantized_base:
            quantized = n - head
    base_tensors = len(facts.param_shapes) or 9 * facts.num_layers + 3  # the model's own tensors; Llama's 9 a layer if unlisted
    layer_linears = sum(1 for name, *_ in facts.linear_layers if ".0." in name or name.startswith("0."))
    weight_dtype_bytes = DTYPE_BYTES[wl.weight_dtype]
    act = BYTES.get(compute_dtype, 4)
    on_cpu = gpu.is_cpu or wl.device == "cpu"
    adapter_fwd, adapter_bwd = adapter_bytes(wl, counts.fan_in, counts.fan_out) if frozen else (0.0, 0.0)
    attention = "eager" if wl.attn_implementation == "eager" else "flash"
    return StepShape(
        tokens=wl.per_device_batch * wl.seq_len,
        seq_len=wl.seq_len,
        batch=wl.per_device_batch,
        accumulation=wl.gradient_accumulation_steps,
        layers=facts.num_layers,
        hidden=facts.hidden_size,
        intermediate=facts.intermediate_size,
        heads=facts.num_attention_heads,
        head_dim=facts.head_dim,
        vocab=facts.vocab_size if facts.task == "causal-lm" else 0,
        body_params=n - head,
        head_params=head,
        n_params=facts.n_params,
        trainable_params=counts.trainable,
        frozen_base=frozen,
        quantized_params=quantized,
        adapters_per_layer=counts.per_layer,
        adapter_fwd_bytes=adapter_fwd,
        adapter_bwd_bytes=adapter_bwd,
        linears_per_layer=layer_linears or 7,
        compute_dtype=compute_dtype,
        act_bytes=act,
        weight_bytes=act if act < weight_dtype_bytes else weight_dtype_bytes,
        stored_weight_bytes=0.5 if quantized else weight_dtype_bytes,
        grad_bytes=4 if frozen else weight_dtype_bytes,
        autocast_cast=act < weight_dtype_bytes,
        optim=wl.optim,
        checkpointing=wl.gradient_checkpointing,
        attention=attention,
        on_cpu=on_cpu,
        zero3_tensors=base_tensors + counts.tensors,
        trainable_tensors=counts.tensors if frozen else base_tensors,
        saved_params=counts.saved,
        saved_linear_params=counts.saved_linear,
        saved_head_params=counts.saved_head,
        saved_grad_bytes=(4 if method.quantized_base else weight_dtype_bytes) if counts.saved else 0,
        attention_dropout=facts.attention_dropout,
        hidden_dropout=facts.hidden_dropout,
        gelu_new=facts.mlp == "plain" and facts.model_type in GELU_NEW_MODELS,
        eager_stream=eager_stream(facts, wl, act, on_cpu),
    )


def checkpoint_host_kernels(s: StepShape) -> float:
    """Checkpointing's own host work in one micro-batch, in kernel launches' worth (CHECKPOINT_HOST_KERNELS)."""
    if not s.checkpointing:
        return 0.0
    layer, adapter = CHECKPOINT_HOST_KERNELS[CHECKPOINT_MODE]
    return s.layers * (layer + adapter * s.adapters_per_layer)


def kernels_per_micro_batch(s: StepShape) -> int:
    """Kernel launches of one micro-batch: forward, backward and the recomputed forward."""
    extra = (
        (EAGER_ATTENTION_KERNELS_FWD + (s.attention_dropout > 0) if s.attention == "eager" else 0)
        + (GELU_NEW_KERNELS_FWD if s.gelu_new else 0)
        + (HIDDEN_DROPOUTS_PER_LAYER if s.hidden_dropout > 0 else 0)
    )
    fwd = LAYER_KERNELS_FWD + extra + s.adapters_per_layer * ADAPTER_KERNELS_FWD
    bwd = BACKWARD_KERNEL_RATIO * (LAYER_KERNELS_FWD + extra) + s.adapters_per_layer * ADAPTER_KERNELS_BWD
    passes = 3 if s.checkpointing else 2
    dequant = DEQUANT_KERNELS * passes * (s.linears_per_layer if s.quantized_params else 0)
    per_layer = fwd * (2 if s.checkpointing else 1) + bwd + dequant
    return int(s.layers * per_layer + 2 * HEAD_KERNELS)
