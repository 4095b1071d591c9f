"""The randomized analytic-vs-trace guard: a seeded sampler over the memory model's configuration space.

Shared by tests/plan/test_memory_guard.py (a handful of cases in CI) and benchmarks/memory_guard.py
(hundreds, with the table in benchmarks/RESULTS.md). Each case is one Workload on one small model
of a family the analytic model has rows for, drawn by `random.Random(seed)`: the method (full,
lora, qlora), precision (fp32, fp32 weights under bf16/fp16 autocast, bf16 weights with and
without bf16 autocast), a random non-empty subset of the linear layers as LoRA targets, rank,
DoRA, lora_dropout, gradient checkpointing, packed sequences, optimizer, accumulation, batch and
sequence length. `check` traces the case (gpuplan.trace.trace_memory: the real transformers,
peft and bitsandbytes code under FakeTensorMode) and compares the analytic estimate.

The targets the guard holds (TARGETS): |analytic - traced| / traced of the allocated peak,
per case and as the median over the cases of a method.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpuplan.plan.estimate.memory.types import Adapters, Workload

# Small models, one per block style the analytic model tabulates (plan/estimate/memory/activations.py
# STYLE_OF); widths differ from the coefficient fits' so the guard is not the fit's own data.
FAMILIES = {
    "llama": dict(
        model_type="llama",
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        vocab_size=3000,
        max_position_embeddings=2048,
    ),
    "mistral": dict(
        model_type="mistral",
        hidden_size=160,
        intermediate_size=448,
        num_hidden_layers=2,
        num_attention_heads=5,
        num_key_value_heads=1,
        vocab_size=2500,
        sliding_window=None,
        max_position_embeddings=2048,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=224,
        intermediate_size=576,
        num_hidden_layers=2,
        num_attention_heads=7,
        num_key_value_heads=1,
        vocab_size=3500,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    "gemma": dict(
        model_type="gemma",
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=48,
        vocab_size=3000,
        max_position_embeddings=2048,
    ),
    "gpt2": dict(model_type="gpt2", n_embd=192, n_layer=2, n_head=6, vocab_size=3000, n_positions=2048),
    "gpt_neox": dict(
        model_type="gpt_neox",
        hidden_size=192,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=6,
        vocab_size=3000,
        max_position_embeddings=2048,
    ),
    "opt": dict(
        model_type="opt",
        hidden_size=192,
        ffn_dim=768,
        num_hidden_layers=2,
        num_attention_heads=6,
        vocab_size=3000,
        word_embed_proj_dim=192,
        max_position_embeddings=2048,
    ),
    "phi": dict(
        model_type="phi",
        hidden_size=192,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=6,
        vocab_size=3000,
        max_position_embeddings=2048,
    ),
}
# the rotary decoder families with position_ids, whose transformers mask builder detects packing
PACKING_FAMILIES = frozenset({"llama", "mistral", "qwen2", "gemma", "phi", "gpt_neox", "gpt2"})
PRECISIONS = {  # name -> Workload fields
    "fp32": dict(weight_dtype="float32", amp=None),
    "amp-bf16": dict(weight_dtype="float32", amp="bf16"),
    "amp-fp16": dict(weight_dtype="float32", amp="fp16"),
    "bf16": dict(weight_dtype="bfloat16", amp=None),
    "bf16+amp": dict(weight_dtype="bfloat16", amp="bf16"),  # what a plan runs for model.dtype bf16 on Ampere+
}
SIZES = [(1, 512), (2, 256), (4, 128), (2, 512), (1, 1024), (4, 256), (8, 64)]
OPTIMIZERS = ["adamw_torch_fused", "adamw_torch", "adamw_torch_fused", "sgd"]
METHODS = ("full", "lora", "qlora")

# |error| of the allocated peak: per case, and the median over a method's cases
TARGETS = {"full": (0.05, 0.01), "lora": (0.06, 0.02), "qlora": (0.06, 0.02)}


@dataclass(frozen=True)
class Case:
    family: str
    workload: Workload

    @property
    def method(self) -> str:
        return "full" if self.workload.adapters is None else self.workload.adapters.method

    def label(self) -> str:
        wl, a = self.workload, self.workload.adapters
        prec = next(k for k, v in PRECISIONS.items() if v == dict(weight_dtype=wl.weight_dtype, amp=wl.amp))
        bits = [self.family, self.method, prec, f"b{wl.per_device_batch}s{wl.seq_len}", wl.optim]
        if a is not None:
            bits.append(f"r{a.r}:{'+'.join(a.target_modules)}")
            bits += [x for x, on in (("dora", a.use_dora), (f"drop{a.lora_dropout}", a.lora_dropout > 0)) if on]
        bits += [
            x
            for x, on in (
                ("ckpt", wl.gradient_checkpointing),
                ("packed", wl.packed),
                (f"acc{wl.gradient_accumulation_steps}", wl.gradient_accumulation_steps > 1),
            )
            if on
        ]
        return "-".join(bits)


def sample(seed: int, n: int, methods: tuple[str, ...] = METHODS) -> list[Case]:
    """n cases drawn by a seeded generator: the same seed, the same cases."""
    from gpuplan.modelinfo import model_facts
    from gpuplan.modelinfo.lora_targets import resolve_targets

    rng = random.Random(seed)
    out = []
    for k in range(n):
        method = methods[k % len(methods)]  # every method equally often
        family = rng.choice(sorted(FAMILIES))
        facts = model_facts(FAMILIES[family])
        prec = rng.choice(["fp32", "amp-bf16", "bf16", "bf16+amp"] + (["amp-fp16"] if method == "full" else []))
        if method == "qlora":
            prec = rng.choice(["amp-bf16", "bf16+amp", "fp32"])  # the base loads in its compute dtype either way
        b, s = rng.choice(SIZES)
        adapters = None
        if method != "full":
            names = resolve_targets(facts, "all-linear", [])
            targets = tuple(sorted(rng.sample(names, rng.randint(1, len(names)))))
            adapters = Adapters(
                method=method,
                r=rng.choice([4, 8, 16, 32, 64]),
                target_modules=targets,
                use_dora=rng.random() < 0.3,
                lora_dropout=rng.choice([0.0, 0.0, 0.05, 0.1]),
                compute_dtype="bfloat16",
            )
        wl = Workload(
            b,
            s,
            gradient_accumulation_steps=rng.choice([1, 1, 1, 2]),
            optim=rng.choice(OPTIMIZERS),
            gradient_checkpointing=rng.random() < 0.4,
            adapters=adapters,
            packed=family in PACKING_FAMILIES and rng.random() < 0.3,
            **PRECISIONS[prec],
        )
        out.append(Case(family, wl))
    return out


def check(case: Case) -> tuple[int, int, float]:
    """(traced, analytic, error) allocated peak bytes of one case; error = (analytic - traced) / traced."""
    from gpuplan.modelinfo import model_facts
    from gpuplan.plan.estimate.memory.estimate import estimate_memory
    from gpuplan.trace import trace_memory

    cfg = FAMILIES[case.family]
    traced = trace_memory(cfg, case.workload).allocated_peak_bytes
    analytic = estimate_memory(model_facts(cfg), case.workload).allocated_peak_bytes
    return traced, analytic, (analytic - traced) / traced
