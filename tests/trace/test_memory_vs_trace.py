"""Analytic estimate against the fake-tensor trace of the real model (tiny configs).

The analytic formulas' coefficients were counted from each block's code and checked
against the trace; these cases keep them honest: families x optimizers x precision x
checkpointing x attention x task. Tolerance 3% (the benchmark's median is ~0.1%).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # each case traces a (tiny) real model: about a second

from gpuplan.modelinfo import model_facts  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.types import Workload  # noqa: E402
from gpuplan.trace import trace_memory  # noqa: E402

LLAMA = dict(
    model_type="llama",
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2000,
)
GEMMA = dict(
    model_type="gemma",
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    vocab_size=2000,
)
GPT2 = dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=2000, n_positions=1024)
NEOX = dict(
    model_type="gpt_neox",
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=2000,
    max_position_embeddings=1024,
)
MIXTRAL = dict(
    model_type="mixtral",
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2000,
    num_local_experts=4,
    num_experts_per_tok=2,
)
BERT = dict(
    model_type="bert",
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=2000,
    max_position_embeddings=1024,
)

CASES = [
    (LLAMA, Workload(4, 256)),
    (LLAMA, Workload(4, 256, amp="bf16", optim="adamw_8bit")),
    (LLAMA, Workload(2, 512, weight_dtype="bfloat16", optim="adafactor", gradient_checkpointing=True)),
    (LLAMA, Workload(2, 256, amp="fp16", attn_implementation="eager", gradient_accumulation_steps=2)),
    (GEMMA, Workload(4, 256, amp="bf16", optim="sgd")),
    (GPT2, Workload(4, 256, amp="bf16", optim="adamw_torch_fused", gradient_checkpointing=True)),
    (GPT2, Workload(2, 256, attn_implementation="eager")),
    (NEOX, Workload(4, 256, weight_dtype="bfloat16", optim="adamw_torch")),
    (BERT, Workload(4, 256, amp="bf16", task="masked-lm")),
    (BERT, Workload(8, 128, amp="bf16", task="seq-cls", num_labels=3)),
    (MIXTRAL, Workload(4, 256, weight_dtype="bfloat16")),  # MoE block: router, dispatch, top-k expert MLPs
]


@pytest.mark.parametrize(
    "cfg,wl",
    CASES,
    ids=lambda x: (
        x["model_type"]
        if isinstance(x, dict)
        else f"{x.weight_dtype}-{x.amp}-{x.optim}-ck{int(x.gradient_checkpointing)}-{x.attn_implementation}-{x.task}"
    ),
)
def test_analytic_matches_trace(cfg, wl):
    facts = model_facts(cfg, wl.task, wl.num_labels)
    traced = trace_memory(cfg, wl)
    analytic = estimate_memory(facts, wl)
    err = (analytic.allocated_peak_bytes - traced.allocated_peak_bytes) / traced.allocated_peak_bytes
    assert abs(err) <= 0.03, (
        f"analytic {analytic.allocated_peak_bytes} vs traced {traced.allocated_peak_bytes} "
        f"({err:+.2%}); traced parts {dict(traced.components)}, analytic "
        f"{dict(analytic.components)}"
    )
    # the model states are exact, whatever the moment
    assert analytic.components["weights"] == pytest.approx(traced.components["weights"], rel=0.01)
    # the same overhead model on both sides
    assert (analytic.reserved_peak_bytes - analytic.allocated_peak_bytes) == pytest.approx(
        traced.reserved_peak_bytes - traced.allocated_peak_bytes, rel=0.05
    )
