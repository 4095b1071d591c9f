"""The rows of published-throughput.json as plannable runs: facts, workload, GPU, links.

Each usable row is planned with that run's own settings (model shape from its
config.json, method, LoRA rank and targets, precision, micro-batch, accumulation,
sequence length, checkpointing, attention, sharding, GPUs and nodes) through the
plan's own throughput function (plan/estimate/throughput.py estimate_throughput, the step-time
model, with plan/estimate/comm_time.py's section). No row, model or source is special-cased:
the reasons a row is left out are general (see `why_left_out`).

Model shapes (config.json of each Hub repo, as published): Llama-2 7B/70B, Llama-3.1
8B/70B, Yi-34B and Mistral-7B-v0.1 (Llama's module tree, its attention windowed at 4,096 tokens),
planned as transformers' Llama. Qwen (v1) is its own module tree (the Hub repos'
remote code, modeling_qwen.py, which transformers does not ship): planned with its own parameter
tensors and linears (qwen_v1_facts), hidden, layers, heads and vocab from its config.json,
intermediate = ffn_hidden_size / 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpuplan.hardware.catalog import load_interconnects, lookup
from gpuplan.hardware.profile import GPUProfile
from gpuplan.modelinfo.count import facts_from_params, model_facts
from gpuplan.modelinfo.facts import ModelFacts
from gpuplan.modelinfo.params import Dims, ParamList
from gpuplan.plan.estimate.comm_time import communication
from gpuplan.plan.estimate.memory import adapters_sharded as AS
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.estimate.step_time import shape as S
from gpuplan.plan.estimate.step_time.constants import HBM_FRACTION
from gpuplan.plan.estimate.throughput import estimate_throughput

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "published-throughput.json"  # and its .md: fields and caveats

# (hidden, layers, heads, kv heads, intermediate, vocab)
SHAPES = {
    "meta-llama/Llama-2-7b-hf": (4096, 32, 32, 32, 11008, 32000),
    "meta-llama/Llama-2-70b-hf": (8192, 80, 64, 8, 28672, 32000),
    "mistralai/Mistral-7B-v0.1": (4096, 32, 32, 8, 14336, 32000),  # sliding window 4,096: no row is longer
    "01-ai/Yi-34B": (7168, 60, 56, 8, 20480, 64000),
    "meta-llama/Llama-3.1-8B": (4096, 32, 32, 8, 14336, 128256),
    "meta-llama/Llama-3.1-70B": (8192, 80, 64, 8, 28672, 128256),
    "Qwen/Qwen-1_8B": (2048, 24, 16, 16, 5504, 151936),
    "Qwen/Qwen-7B": (4096, 32, 32, 32, 11008, 151936),
    "Qwen/Qwen-14B": (5120, 40, 40, 40, 13696, 152064),
    "Qwen/Qwen-72B": (8192, 80, 64, 64, 24576, 152064),
}
# Hub repos that copy another's weights and config: the same checkpoint under another name (`checkpoint`).
COPIES = {"NousResearch/Llama-2-70b-hf": "meta-llama/Llama-2-70b-hf"}
# Catalog entry per published GPU description (first match wins).
GPUS = (
    ("RTX 3090", "RTX-3090"),
    ("RTX 6000 Ada", "RTX-6000-Ada"),
    ("A100-SXM4-80GB", "A100-80GB"),
    ("A100 80GB", "A100-80GB"),
    ("A100 40GB", "A100-40GB"),
    ("H100 80GB SXM", "H100-80GB"),
    ("H100 SXM-class", "H100-80GB"),
    ("H200", "H200"),
)
# Qwen's Int4 rows train on GPTQ checkpoints (auto-gptq's dequantization, see below), not on bitsandbytes
# NF4 as gpuplan's qlora does: their 4-bit dequantization runs at a bandwidth fraction of its own,
# fitted with the rest (benchmarks/fit_step_time.py), so that constants.DEQUANT_BW_FRACTION is
# bitsandbytes' (the fsdp_qlora rows) and not a blend of the two kernels.
GPTQ_DEQUANT_BW_FRACTION = 0.1038
# Its prior, from the kernels: Qwen's finetune.py loads the Int4 checkpoints with GPTQConfig(bits=4,
# disable_exllama=True), so auto-gptq (0.4-0.5, desc_act off) takes qlinear_cuda_old.QuantLinear, whose forward
# for 128 tokens or more (kernel_switch_threshold) dequantizes the whole weight in eager torch ops before
# torch.matmul: shift of the expanded int32 words (reads 0.5 B, writes 4 B per weight), cast to int8 (4 + 1),
# the in-place mask (1 + 1), minus the zeros (1 + 1), times the fp16 scales (1 + 2): 16.5 B per weight per pass,
# each a streaming kernel at HBM_FRACTION. Autograd keeps the dequantized fp16 weight for the backward matmul,
# so it dequantizes in the forward and the recomputed forward only: 2 passes where bitsandbytes' 2.5 B runs 3
# (plan/estimate/step_time/terms.py prices 2.5 B x 3 passes at the fraction). As that fraction: 0.8 x 7.5 / 33 = 0.18.
GPTQ_EAGER_BYTES = 16.5
GPTQ_DEQUANT_PRIOR = round(HBM_FRACTION * (2.5 * 3) / (GPTQ_EAGER_BYTES * 2), 3)
# The same eager path launches, per quantized linear and forward: the shift, int8 cast, mask and +1 of the zeros,
# the shift, cast and mask of the weight, the subtraction and the scaling (9 kernels; the reshapes are views, the
# fp16 matmul is the linear's own), in the forward and the recomputed forward (autograd keeps the dequantized
# weight: none in the backward). The plan counts bitsandbytes' DEQUANT_KERNELS per quantized linear in each of its
# passes (plan/estimate/step_time/shape.py kernels_per_micro_batch); a GPTQ row is planned with the per-pass count
# that gives these kernels instead.
GPTQ_EAGER_KERNELS = 9
# The step-time model's "Trainer and dataloader" term is the HF Trainer loop's per-step host work
# (gpuplan applies through it). torchtitan and fsdp_qlora's train.py run loops of their own
# (the rows' `framework`): their rows are planned without that term.
HF_TRAINER = ("HF Trainer", "SFTTrainer")
# Qwen (v1) checkpoints: the SHAPES keys whose module tree is modeling_qwen.py's, not Llama's.
QWEN_V1 = "Qwen/Qwen-"
# Checkpointing's form (plan/estimate/step_time/shape.py CHECKPOINT_HOST_KERNELS prices each form's own host work): the
# HF Trainer of transformers 4 ran gradient_checkpointing_enable() reentrantly (torch.utils.checkpoint's default then;
# transformers 5 passes use_reentrant=False), and fsdp_qlora's train.py command says --reentrant_checkpointing True.
REENTRANT = "reentrant_checkpointing True"
# lora_dropout of a source's runs (Adapters.lora_dropout: the adapter path's dropout bytes, shape.ADAPTER_BYTES), where
# its scripts set it; the other sources' runs are planned without dropout (not stated)
LORA_DROPOUT = {
    "fms-acceleration": 0.1,  # scripts/benchmarks/scenarios.yaml at 24bdadb228: lora_dropout 0.1 (every peft scenario)
    "AnswerDotAI/fsdp_qlora": 0.1,  # train.py at e877dda502: lora_dropout default 0.1; the benchmark commands keep it
    "QwenLM/Qwen": 0.05,  # finetune.py at 2df8e8ac45: LoraArguments.lora_dropout = 0.05; finetune/*.sh keep it
    "modelscope/ms-swift": 0.05,  # swift/llm/utils/argument.py at cdb169b781: lora_dropout_p = 0.05
}
# peft 0.12 made get_peft_model keep adapters in fp32 over a 16-bit base (autocast_adapter_dtype=True); a row whose
# software names an older peft, or none (all of them ran before August 2024, or not on peft), made them in the base's
# dtype: shape.ADAPTER_UPCAST
PEFT_UPCAST = (0, 12)
# Sources whose QLoRA code quantizes the base without peft's prepare_model_for_kbit_training, so the unquantized
# parameters stay in the dtype they were loaded in (memory/adapters_sharded.py KBIT_UPCAST, the bytes FSDP gathers):
# fsdp_qlora's train.py at e877dda502 loads the model in bf16 under --precision bf16 (torch_dtype, the Linear4bit
# quant_storage) and calls get_peft_model alone
KBIT_UNPREPARED = ("AnswerDotAI/fsdp_qlora",)
# Sources whose runs fused the decoder layer's elementwise work (shape.LAYER_KERNELS "fused": the hand count), and
# what fused it; every other run executed transformers' (or its own) layer eagerly. A torch.compile'd row is fused
# whatever its source (the row's compile field).
FUSED_SOURCES = (
    # Qwen(-1)'s modeling_qwen.py imports flash-attn's rotary (apply_rotary_emb_func) and RMSNorm (rms_norm) kernels
    # when flash-attn is installed, as both sources' runs had it (flash-attention 2; ms-swift's flash_attn 2.3.4); the
    # fused RMSNorm needs flash-attn's csrc/layer_norm built, which Qwen's own finetuning images do (docker/Dockerfile
    # and Dockerfile-cu121 at 2df8e8ac45: "pip3 install csrc/layer_norm" after flash-attention v2.3.3)
    "QwenLM/Qwen",
    "modelscope/ms-swift",
)
# Words by which a row names the network between its nodes (e.g. torchtitan's "400 Gb/s RDMA per GPU").
# A run on several nodes crosses that network with every collective (plan/estimate/comm_time.py prices
# it from the network's bandwidth); a row that does not say which network it ran on cannot be planned
# with its own settings, whatever its source (why_left_out).
NETWORK_WORDS = ("RDMA", "InfiniBand", "RoCE", "Ethernet", "EFA", "Gb/s")
# Rows timed in samples/s whose tokens per sample were not published (ms-swift's Benchmark.md: the samples over max_length
# are deleted and the mean length of the rest is not given). Rows of one source that train the same samples -- the same
# dataset (seq_len_kind), the same max_length (and so the same subset, where a source samples one by length),
# micro-batches of 1 (no padding: each sample at its own length) and the same tokenizer -- process the same tokens per
# sample whatever the model, so their plans are checked against each other: the group's tokens per sample is the one
# value its plans fit best, at most max_length (`evaluate`). A group of one row checks nothing (usable_runs leaves it out).
SAMPLES_UNIT = "samples/s"
# Checkpoints that share a tokenizer: Qwen (v1) 1.8B to 72B all ship tokenization_qwen.py over one qwen.tiktoken
# (the Hub repos' files); any other model is its own.
TOKENIZERS = {QWEN_V1: "Qwen (v1) qwen.tiktoken"}
# A group's tokens per sample is sought between 1/16 of max_length and max_length (the low end is far below any plausible
# mean: ms-swift's shortest sample is 91 tokens, more than 1/6 of its smallest max_length, 512, and its data's mean length
# is 3,234). Each row is planned at these fractions of its max_length, its time per sample linear in between (evaluate).
LENGTHS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1)


class TokensGroup(NamedTuple):
    """What the rows that train the same samples share (SAMPLES_UNIT)."""

    source: str
    dataset: str  # the row's seq_len_kind
    max_length: str
    tokenizer: str


@dataclass(frozen=True)
class Run:
    row: dict[str, Any]
    facts: ModelFacts
    workload: Workload
    gpu: GPUProfile
    count: int
    nodes: int
    dtype_note: str
    gptq: bool = False  # a GPTQ int4 base (GPTQ_DEQUANT_BW_FRACTION), not bitsandbytes NF4
    hf_trainer: bool = True  # trained through the HF Trainer (HF_TRAINER), not a loop of its own
    reentrant: bool = False  # checkpointed in torch.utils.checkpoint's reentrant form (REENTRANT)
    tokens_group: TokensGroup | None = None  # measured in samples/s, tokens per sample shared by a group (SAMPLES_UNIT)
    at_lengths: tuple[Run, ...] = ()  # a tokens group's row planned at LENGTHS of its max_length (evaluate)


def load_rows() -> list[dict[str, Any]]:
    return json.loads(DATA.read_text())


def source_name(row: dict[str, Any]) -> str:
    """The repository a row comes from (github.com/ORG/REPO), or its first words."""
    words = row["source"].split()
    return words[0].removeprefix("github.com/") if words[0].startswith("github.com") else " ".join(words[:1])


def checkpoint(row: dict[str, Any]) -> str:
    """The checkpoint a row trained: its model id, or the repo a copy was taken from (COPIES)."""
    return COPIES.get(row["model"], row["model"])


def _shape(model: str) -> tuple[int, ...] | None:
    model = COPIES.get(model, model)  # a copy has its original's shape
    key = next((k for k in sorted(SHAPES, key=len, reverse=True) if model.startswith(k)), None)
    return SHAPES.get(key) if key else None


def _per_node(row: dict[str, Any]) -> int:
    """GPUs per node: 8 (an HGX / DGX node) unless the row says otherwise."""
    world = int(row["num_gpus"])
    if "2 nodes x 2 GPUs" in (row.get("sharding") or "") or "2 servers x 2 GPUs" in (row.get("other_opts") or ""):
        return 2
    return min(world, 8)


def tokens_group(row: dict[str, Any]) -> TokensGroup | None:
    """The rows that train the same samples as `row`, by what they share (SAMPLES_UNIT), or None when `row` has a tokens/s
    of its own or its tokens per sample are its own (padded micro-batches, or a unit other than samples/s)."""
    if row.get("derived_tokens_per_s_per_gpu") is not None or row.get("unit") != SAMPLES_UNIT or int(row["batch_size"]) != 1:
        return None
    tokenizer = next((t for k, t in TOKENIZERS.items() if row["model"].startswith(k)), row["model"])
    return TokensGroup(source_name(row), str(row.get("seq_len_kind")), str(row["seq_len"]), tokenizer)


def ratio_sources(runs: list[Run]) -> set[str]:
    """The sources timed in samples/s whose rows are checked against each other (evaluate): their errors are relative to
    each group's fitted tokens per sample, so they stay out of figures against a published tokens/s."""
    return {source_name(r.row) for r in runs if r.tokens_group is not None}


def why_left_out(row: dict[str, Any]) -> str | None:
    """None for a usable row; else the general reason it cannot be planned and checked."""
    if row.get("derived_tokens_per_s_per_gpu") is None and tokens_group(row) is None:
        return "no tokens/s derivable (sample lengths or steps not published)"
    if "device_map" in (row.get("sharding") or ""):
        return "layers split across GPUs with device_map (one GPU busy at a time): not a strategy gpuplan plans"
    if re.match(r"int8\b", (row.get("quantization") or "").lower()):
        return "8-bit quantized base: gpuplan plans 4-bit bases (bitsandbytes NF4; GPTQ int4 here)"
    if row.get("completeness", 0) < 0.9:
        return "completeness < 0.9: settings assumed (the .md's caveat)"
    other = (row.get("other_opts") or "") + " " + (row.get("precision") or "")
    if "Float8" in other or "float8" in other.replace("no float8", ""):
        return "Float8 linears: gpuplan plans no fp8 training"
    sharding = row.get("sharding") or ""
    if "TP" in sharding or "tensor par" in sharding or "context parallel" in sharding:
        return "tensor / context parallelism: not a strategy gpuplan plans"
    if "activation CPU offload" in sharding or 'Activation Offload" column = True' in (row.get("note") or ""):
        return "activation CPU offload: not a strategy gpuplan plans"
    if not any(k in row["gpu"] for k, _ in GPUS):
        return f"GPU not in the catalog ({row['gpu'].split(' (')[0]})"
    if _shape(row["model"]) is None:
        return "model shape unknown"
    said = " ".join(str(row.get(k) or "") for k in ("gpu", "sharding", "other_opts", "note"))
    if int(row["num_gpus"]) > _per_node(row) and not any(re.search(rf"\b{re.escape(w)}\b", said) for w in NETWORK_WORDS):
        return "several nodes, the network between them not published: the cross-node collectives cannot be planned"
    return None


def _targets(row: dict[str, Any]) -> tuple[str, ...]:
    text = (row.get("lora_targets") or "").split(" ")[0].split(";")[0]
    names = [t.strip() for t in text.split(",") if t.strip()]
    return tuple(dict.fromkeys(names)) or ("q_proj", "v_proj")


def layer_kernels(row: dict[str, Any]) -> str:
    """ "fused" where the row's run fused its layers' elementwise work (FUSED_SOURCES, torch.compile), else "eager"."""
    fused = row.get("compile") is True or any(k in row["source"] for k in FUSED_SOURCES)
    return "fused" if fused else "eager"


def peft_upcasts(row: dict[str, Any]) -> bool:
    """Whether the row's peft keeps the adapters in fp32 over a 16-bit base (PEFT_UPCAST)."""
    m = re.search(r"\bpeft (\d+)\.(\d+)", row.get("software") or "")
    return m is not None and (int(m.group(1)), int(m.group(2))) >= PEFT_UPCAST


def _saved(row: dict[str, Any]) -> tuple[str, ...]:
    """The modules a row trains in full beside its adapters (peft's modules_to_save), as its lora_targets say:
    "... + trainable wte and lm_head (modules_to_save, ...)" (Qwen's finetune.py on a base model: the "LoRA (emb)" rows)."""
    said = re.search(r"trainable ([\w, ]+?) \(modules_to_save", row.get("lora_targets") or "")
    return tuple(n.strip() for n in re.split(r",| and ", said.group(1)) if n.strip()) if said else ()


def qwen_v1_facts(hidden: int, layers: int, heads: int, inter: int, vocab: int) -> ModelFacts:
    """Qwen (v1)'s causal LM as its remote code builds it (modeling_qwen.py of the Hub repos Qwen/Qwen-1_8B, -7B,
    -14B, -72B; config no_bias = true, kv_channels = hidden / heads): transformer.wte; per block ln_1 (RMSNorm),
    attn.c_attn = Linear(h, 3h) with a bias (q, k and v fused), attn.c_proj = Linear(h, h), ln_2, mlp.w1 and mlp.w2 =
    Linear(h, ffn_hidden_size / 2) and mlp.c_proj = Linear(ffn_hidden_size / 2, h), none with a bias; transformer.ln_f
    and an untied lm_head. Five linears and eight tensors a layer, where the Llama tree has seven and nine: LoRA on
    "c_attn,c_proj,w1,w2" wraps five linears (ten A/B tensors), and DeepSpeed hooks eight base tensors a layer."""
    p = ParamList()
    p.embedding("transformer.wte", vocab, hidden)
    for n in range(layers):
        b = f"transformer.h.{n}"
        p.norm(f"{b}.ln_1", hidden, bias=False)
        p.linear(f"{b}.attn.c_attn", hidden, 3 * hidden, bias=True)
        p.linear(f"{b}.attn.c_proj", hidden, hidden, bias=False)
        p.norm(f"{b}.ln_2", hidden, bias=False)
        p.linear(f"{b}.mlp.w1", hidden, inter, bias=False)
        p.linear(f"{b}.mlp.w2", hidden, inter, bias=False)
        p.linear(f"{b}.mlp.c_proj", inter, hidden, bias=False)
    p.norm("transformer.ln_f", hidden, bias=False)
    p.add("lm_head.weight", vocab, hidden)
    dims = Dims(
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=32768,
        mlp="gated",
        norm="rmsnorm",
        tie_word_embeddings=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return facts_from_params("qwen", {"tie_word_embeddings": False}, "causal-lm", p, dims)


def plan_run(row: dict[str, Any]) -> Run:
    hidden, layers, heads, kv, inter, vocab = _shape(row["model"])
    if row["model"].startswith(QWEN_V1):
        facts = qwen_v1_facts(hidden, layers, heads, inter, vocab)
    else:
        facts = model_facts(
            {
                "model_type": "llama",
                "hidden_size": hidden,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "intermediate_size": inter,
                "vocab_size": vocab,
                "tie_word_embeddings": False,
                "max_position_embeddings": 131072,
            }
        )
    gpu = lookup(next(name for k, name in GPUS if k in row["gpu"]))
    world = int(row["num_gpus"])
    sharding, precision = row.get("sharding") or "", (row.get("precision") or "").lower()
    fp16 = precision.startswith("fp16")
    weight = "float16" if fp16 else "bfloat16"
    amp = "fp16" if fp16 else "bf16"
    engine, stage, shards = "none", 0, 1
    if "FSDP" in sharding:
        engine = "fsdp"
        stage, shards = (0, 1) if "NO_SHARD" in sharding else (3, world)
    elif "DeepSpeed" in sharding or "finetune_ds" in sharding:
        engine = "deepspeed"
        stage = 3 if "ZeRO-3" in sharding else 2
        shards = world
    elif world > 1:
        engine = "ddp"
    if world > 1 and engine == "none":
        engine = "ddp"
    ac = row.get("activation_checkpointing")
    checkpointing = ac is True or ac == "full"
    attn = "eager" if "eager" in (row.get("attention_impl") or "").lower() else "sdpa"
    adapters = None
    if row["method"] in ("lora", "qlora"):
        adapters = Adapters(
            method=row["method"],
            r=int(row.get("lora_rank") or 8),
            target_modules=_targets(row),
            modules_to_save=_saved(row),
            lora_dropout=next((p for k, p in LORA_DROPOUT.items() if k in row["source"]), 0.0),
            compute_dtype=weight,
        )
    if precision.startswith("pure"):  # 16-bit weights and no autocast (bf16-true, --precision bf16, no bf16 flag)
        amp = None
    wl = Workload(
        per_device_batch=int(row["batch_size"]),
        seq_len=int(row["seq_len"]),
        gradient_accumulation_steps=int(row.get("grad_accum") or 1),
        weight_dtype=weight,
        amp=amp,
        optim="adamw_torch",
        gradient_checkpointing=checkpointing,
        attn_implementation=attn,
        engine=engine,
        shard_world_size=shards,
        zero_stage=stage,
        offload_params="CPU offload" in sharding,
        adapters=adapters,
    )
    per_node = _per_node(row)
    note = "selective AC planned as none" if isinstance(ac, str) and ac.startswith("selective") else ""
    gptq = "gptq" in (row.get("quantization") or "").lower()
    hf = any(k in (row.get("framework") or "") for k in HF_TRAINER)
    reentrant = hf or REENTRANT in (row.get("other_opts") or "")
    run = Run(row, facts, wl, gpu, per_node, world // per_node, note, gptq, hf, reentrant, tokens_group(row))
    if run.tokens_group is None:
        return run
    lengths = tuple(dataclasses.replace(run, workload=dataclasses.replace(wl, seq_len=round(wl.seq_len * f))) for f in LENGTHS)
    return dataclasses.replace(run, at_lengths=lengths)


_COMM: dict[int, dict[str, Any]] = {}


def predict(run: Run, *, scale: dict[str, float] | None = None) -> dict[str, Any]:
    """The plan's throughput section for the run (tokens/s per GPU and the step-time terms)."""
    from gpuplan.plan.estimate.step_time import constants as K

    bnb, trainer, kernels, mode = K.DEQUANT_BW_FRACTION, K.TRAINER_STEP_S, S.DEQUANT_KERNELS, S.CHECKPOINT_MODE
    upcast, layers, kbit = S.ADAPTER_UPCAST, S.LAYER_KERNELS, AS.KBIT_UPCAST
    S.ADAPTER_UPCAST, S.LAYER_KERNELS = peft_upcasts(run.row), layer_kernels(run.row)
    AS.KBIT_UPCAST = not any(k in run.row["source"] for k in KBIT_UNPREPARED)
    try:
        comm = _COMM.get(id(run))
        if comm is None:  # the bytes and links depend on no fitted constant: once per run (the fit predicts each row ~2,000 times)
            comm = _COMM[id(run)] = communication(
                run.facts, run.workload, run.gpu, count=run.count, nodes=run.nodes, networks=load_interconnects()
            )
        world = run.count * run.nodes
        if run.gptq:
            K.DEQUANT_BW_FRACTION = GPTQ_DEQUANT_BW_FRACTION
            ckpt = run.workload.gradient_checkpointing
            S.DEQUANT_KERNELS = GPTQ_EAGER_KERNELS * (2 if ckpt else 1) / (3 if ckpt else 2)
        if not run.hf_trainer:
            K.TRAINER_STEP_S = 0.0
        if run.reentrant:
            S.CHECKPOINT_MODE = "reentrant"
        return estimate_throughput(run.facts, run.workload, run.gpu, max_steps=None, world_size=world, comm=comm, scale=scale).to_dict()
    finally:
        K.DEQUANT_BW_FRACTION, K.TRAINER_STEP_S, S.DEQUANT_KERNELS, S.CHECKPOINT_MODE = bnb, trainer, kernels, mode
        S.ADAPTER_UPCAST, S.LAYER_KERNELS, AS.KBIT_UPCAST = upcast, layers, kbit


def usable_runs() -> tuple[list[Run], list[tuple[dict[str, Any], str]]]:
    used, left = [], []
    for row in load_rows():
        why = why_left_out(row)
        if why:
            left.append((row, why))
        else:
            used.append(plan_run(row))
    size = defaultdict(int)
    for r in used:
        size[r.tokens_group] += 1
    alone = {id(r) for r in used if r.tokens_group is not None and size[r.tokens_group] < 2}
    left += [(r.row, "tokens per sample unknown, and no other usable row trains the same samples") for r in used if id(r) in alone]
    return [r for r in used if id(r) not in alone], left


def _per_gpu(run: Run, out: dict[str, Any]) -> float:
    return out["tokens_per_second"] / (run.count * run.nodes)


def _samples_per_gpu(run: Run) -> float:
    return float(run.row["value"]) / int(run.row["num_gpus"])


def _seconds_per_sample(run: Run) -> list[tuple[int, float]]:
    """(tokens, the plan's seconds per sample per GPU) of a tokens group's row at each of its LENGTHS."""
    return [(v.workload.seq_len, v.workload.seq_len / _per_gpu(v, predict(v))) for v in run.at_lengths]


def _at(points: list[tuple[int, float]], tokens: float) -> float:
    """Seconds per sample at `tokens`, linear between the planned lengths (a step's time is affine in its tokens on
    either side of where its host work and its device work cross)."""
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if tokens <= t1:
            return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
    return points[-1][1]


def _best_tokens(points: list[list[tuple[int, float]]], rates: list[float], longest: int) -> float:
    """The tokens per sample between longest x LENGTHS[0] and longest that minimises the group's sum of |log(plan samples/s
    / measured)| (the fit's own objective): a log-spaced search, then golden-section between its best point's
    neighbours."""

    def cost(t: float) -> float:
        return sum(abs(math.log(rate * _at(p, t))) for p, rate in zip(points, rates))

    lo, hi = math.log(longest * LENGTHS[0]), math.log(longest)
    grid = [lo + (hi - lo) * k / 48 for k in range(49)]
    k = min(range(len(grid)), key=lambda i: cost(math.exp(grid[i])))
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(24):
        c, d = b - g * (b - a), a + g * (b - a)
        if cost(math.exp(c)) <= cost(math.exp(d)):
            b = d
        else:
            a = c
    return math.exp((a + b) / 2)


def evaluate(runs: list[Run], *, row_left_out: bool = False) -> tuple[list[float], dict[TokensGroup, float]]:
    """Signed relative error of each run's plan against its measurement, in the order of `runs`, and each tokens group's
    tokens per sample. A row with a published tokens/s: plan tokens/s per GPU / measured - 1. A tokens group's row
    (SAMPLES_UNIT): plan samples/s / measured - 1, the plan at the group's one tokens per sample that fits its rows best
    (at most max_length: no sample kept is longer), so its rows are checked against each other; pass a group's rows
    together. The fit's objective takes that length from all of a group's rows; `row_left_out` (the errors a report
    shows): each row's from the group's other rows, so that no row is scored by a length fitted on itself (fitted on
    all, the middle row of a group is at 0 by construction)."""
    errs: list[float] = [0.0] * len(runs)
    groups: dict[TokensGroup, list[int]] = defaultdict(list)
    for i, r in enumerate(runs):
        if r.tokens_group is None:
            errs[i] = _per_gpu(r, predict(r)) / float(r.row["derived_tokens_per_s_per_gpu"]) - 1
        else:
            groups[r.tokens_group].append(i)
    tokens = {}
    for g, idx in groups.items():
        points = [_seconds_per_sample(runs[i]) for i in idx]
        rates = [_samples_per_gpu(runs[i]) for i in idx]
        longest = runs[idx[0]].workload.seq_len
        t = tokens[g] = _best_tokens(points, rates, longest)
        for k, (i, p, rate) in enumerate(zip(idx, points, rates)):
            if row_left_out:
                t = _best_tokens(points[:k] + points[k + 1 :], rates[:k] + rates[k + 1 :], longest)
            errs[i] = 1 / (_at(p, t) * rate) - 1
    return errs, tokens


def measured(run: Run, tokens: dict[TokensGroup, float]) -> float:
    """The measured tokens/s per GPU: published, or samples/s x the group's tokens per sample (evaluate)."""
    if run.tokens_group is None:
        return float(run.row["derived_tokens_per_s_per_gpu"])
    return _samples_per_gpu(run) * tokens[run.tokens_group]
