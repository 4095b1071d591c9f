"""The memory of a GRPO / RLOO training step: analytic (plan/estimate/memory/generation.py and
preference.py's fused head) against the fake-tensor trace of the real step (gpuplan/trace/rl.py: the
round's tensors and its no-grad log-prob forwards, then TRL's fused log-prob head, the clipped loss
with the KL term, backward, AdamW), full and LoRA. The same 3% as SFT's and DPO's. The generation moment
itself (transformers' KV cache, vLLM's share) is not traced: fake tensors cannot sample and stop."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

from gpuplan.modelinfo import model_facts  # noqa: E402
from gpuplan.plan.estimate.memory.estimate import estimate_memory  # noqa: E402
from gpuplan.plan.estimate.memory.generation import rollout_bytes  # noqa: E402
from gpuplan.plan.estimate.memory.types import Adapters, Workload  # noqa: E402
from gpuplan.trace import trace_memory  # noqa: E402

LLAMA = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=8000,
)
LORA = Adapters(method="lora", r=8, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
# a round of 8 completions (prompt 64 + completion 192 tokens), 2 micro-batches of 4, generated elsewhere
ROUND = dict(objective="grpo", generation="vllm-server", rl_completion_len=192, generation_sequences=8, gradient_accumulation_steps=2)

CASES = [
    Workload(4, 256, **ROUND),  # full, beta 0: no reference
    Workload(4, 256, amp="bf16", reference="copy", **ROUND),  # full, beta > 0: the frozen copy
    Workload(4, 256, amp="bf16", reference="adapters-off", adapters=LORA, **ROUND),  # LoRA: adapters disabled
    Workload(4, 256, amp="bf16", reference="adapters-off", adapters=LORA, gradient_checkpointing=True, **ROUND),
    Workload(4, 256, amp="bf16", reference="copy", **{**ROUND, "objective": "rloo"}),
    Workload(4, 256, device="cpu", **ROUND),  # CPU: TRL's torch fold of the logits tiles
]


@pytest.mark.parametrize(
    "wl",
    CASES,
    ids=lambda w: f"{w.objective}-{w.reference}-{w.amp}-{'lora' if w.adapters else 'full'}-ck{int(w.gradient_checkpointing)}-{w.device}",
)
def test_analytic_rl_step_matches_the_trace(wl):
    facts = model_facts(LLAMA, "causal-lm", 2)
    traced = trace_memory(LLAMA, wl)
    analytic = estimate_memory(facts, wl)
    err = analytic.allocated_peak_bytes / traced.allocated_peak_bytes - 1
    assert abs(err) <= 0.03, (
        f"analytic {analytic.allocated_peak_bytes} vs traced {traced.allocated_peak_bytes} "
        f"({err:+.2%}); traced {dict(traced.components)}, analytic {dict(analytic.components)}"
    )
    assert analytic.components["weights"] == pytest.approx(traced.components["weights"], rel=0.01)


def test_the_round_is_in_the_trace_and_the_reference_copy_only_with_beta():
    off = trace_memory(LLAMA, Workload(4, 256, amp="bf16", **ROUND))
    on = trace_memory(LLAMA, Workload(4, 256, amp="bf16", reference="copy", **ROUND))
    n = model_facts(LLAMA, "causal-lm", 2).n_params
    assert on.components["weights"] - off.components["weights"] == pytest.approx(4 * n, rel=0.01)  # the policy's fp32 dtype
    # the round's tensors (ids and masks, 8 x 256 x 2 int64, the advantages, the old log-probs) are held while a
    # micro-batch trains, as the analytic model counts them
    wl = Workload(4, 256, amp="bf16", **ROUND)
    assert off.components["generation"] == pytest.approx(rollout_bytes(wl), rel=0.05)


@pytest.mark.parametrize(("method", "backend"), [("full", "transformers"), ("lora", "vllm-colocate")])
def test_plan_trace_traces_the_grpo_step(tmp_path, method, backend):
    import json

    from gpuplan.plan.build import plan_file
    from gpuplan.trace.plan import trace_plan
    from tests.helpers.planning import ENV

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"{i} ->", "answer": str(i)}) + "\n" for i in range(8)))
    spec = tmp_path / "grpo.toml"
    spec.write_text(
        f'[model]\nconfig = "config.json"\nmethod = "{method}"\n[hardware]\ngpu = "H100-80GB"\n'
        '[data]\ntrain_files = ["p.jsonl"]\n[training]\nobjective = "grpo"\nper_device_train_batch_size = 4\n'
        "gradient_accumulation_steps = 2\nmax_steps = 10\n"
        f'[rl]\nnum_generations = 4\nmax_prompt_length = 64\nmax_completion_length = 192\nbeta = 0.04\ngeneration_backend = "{backend}"\n'
        '[[rl.rewards]]\nkind = "exact-match"\ncolumn = "answer"\n'
    )
    plan = trace_plan(plan_file(spec, environment=ENV))
    wl = plan.memory.workload
    assert wl.objective == "grpo" and wl.reference == ("copy" if method == "full" else "adapters-off") and wl.generation == backend
    traced = plan.memory.traced
    assert abs(traced["analytic_minus_traced_fraction"]) < 0.03, traced
    assert any("generation: its memory is the analytic model's" in n for n in traced["notes"])
