"""[eval] sample_prompts: generations written to metrics.jsonl while and after apply trains.

At the end of apply (after final/ is saved), and with eval.sample_at_eval after every
evaluation, each prompt is generated greedily (eval.sample_max_new_tokens tokens) in
the training's template (prompting.py) and appended to metrics.jsonl as
    {"event": "sample", "step", "at": "end" | "eval", "prompt", "completion"}
Rank 0 generates alone; under FSDP or DeepSpeed on several processes the weights are
sharded across ranks and one rank cannot run the model, so apply refuses that up front.
Imports torch only when it generates.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from gpuplan.lifecycle.run_dir import METRICS_FILE
from gpuplan.plan.types import Plan


def check(plan: Plan) -> None:
    """Refuse, before training, sample settings this run cannot honour."""
    from gpuplan.apply.errors import ApplyError
    from gpuplan.apply.train.arguments import has_eval

    if not plan.resolved.eval.sample_prompts:
        return
    if plan.resolved.model.task != "causal-lm":
        raise ApplyError(
            f'eval.sample_prompts generates text, which needs model.task = "causal-lm" '
            f"(this run: {plan.resolved.model.task!r}); remove eval.sample_prompts",
            key="eval.sample_prompts",
        )
    world = plan.world_size
    if world > 1 and plan.resolved.distributed.strategy in ("fsdp", "deepspeed"):
        raise ApplyError(
            f"eval.sample_prompts with distributed.strategy = {plan.resolved.distributed.strategy!r} on "
            f"{world} processes: the weights are sharded and rank 0 cannot generate alone",
            key="eval.sample_prompts",
            fix="remove eval.sample_prompts and run `gpuplan generate SPEC` after the run",
        )
    if plan.resolved.eval.sample_at_eval and not has_eval(plan):
        raise ApplyError(
            "eval.sample_at_eval = true but the run never evaluates (no data.eval_files or data.eval_fraction)",
            key="eval.sample_at_eval",
            fix="set data.eval_fraction = 0.05, or eval.sample_at_eval = false (samples at the end only)",
        )


def _rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def write_samples(
    plan: Plan, model: Any, tokenizer: Any, step: int, at: str, echo: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Generate every sample prompt with `model` and append them to metrics.jsonl."""
    import torch

    from gpuplan.apply.data.prompting import prompting
    from gpuplan.apply.model.generation import Loaded, generate

    device = next(model.parameters()).device.type
    amp = None
    if device == "cuda" and plan.resolved.training.bf16:
        amp = torch.bfloat16
    elif device == "cuda" and plan.resolved.training.fp16:
        amp = torch.float16
    was_training = model.training
    model.eval()
    loaded = Loaded(model, tokenizer, device, "the model being trained", amp)
    how = prompting(plan, tokenizer)
    records = []
    try:
        for p in plan.resolved.eval.sample_prompts:
            g = generate(loaded, how, [{"role": "user", "content": p}], max_new_tokens=plan.resolved.eval.sample_max_new_tokens)
            records.append({"event": "sample", "step": step, "at": at, "prompt": p, "completion": g.completion})
    finally:
        if was_training:
            model.train()
    with open(os.path.join(plan.resolved.output.dir, METRICS_FILE), "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    if echo is not None:
        for r in records:
            echo(f"sample at step {step}: {r['prompt']!r} -> {r['completion']!r}")
    return records


def at_end(plan: Plan, model: Any, tokenizer: Any, step: int, echo: Callable[[str], None]) -> None:
    if plan.resolved.eval.sample_prompts and _rank0():
        write_samples(plan, model, tokenizer, step, "end", echo)


def callbacks(plan: Plan, echo: Callable[[str], None]) -> list[Any]:
    """With eval.sample_at_eval: a TrainerCallback that generates after every evaluation."""
    if not (plan.resolved.eval.sample_prompts and plan.resolved.eval.sample_at_eval):
        return []
    from transformers import TrainerCallback

    class SampleAtEval(TrainerCallback):
        def on_evaluate(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.is_world_process_zero and model is not None:
                write_samples(plan, model, processing_class, state.global_step, "eval", echo)

    return [SampleAtEval()]
