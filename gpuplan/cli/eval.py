"""`gpuplan eval`: held-out loss and perplexity, and lm-eval tasks, of a finished run.

The run, --data, --checkpoint and the lm-eval tasks are checked before the model loads;
the results are written into gpuplan-state.json only once everything has been scored,
so a failure leaves the state as it was. `gpuplan show OUTPUT_DIR` prints them.
"""

from __future__ import annotations

import json
import os
import sys

from gpuplan.cli.common import UserError
from gpuplan.lifecycle.run_dir import METRICS_FILE


def cmd_eval(args) -> int:
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported
    if args.checkpoint is not None and args.checkpoint < 0:
        raise UserError(f"--checkpoint {args.checkpoint} must be a step number (a checkpoint-N folder)")
    from gpuplan.after.evaluate import check_data_flag, eval_plan
    from gpuplan.after.finished_run import finished_run
    from gpuplan.apply.train.arguments import has_eval
    from gpuplan.cli.apply import check_remote_code

    data = check_data_flag(args.data)
    run = finished_run(args.spec, args.checkpoint, command="gpuplan eval")
    check_remote_code(run.plan, args.trust_remote_code)
    tasks = list(run.plan.resolved.eval.tasks)
    preference = run.plan.resolved.training.objective.is_preference
    rl = run.plan.resolved.training.objective.is_rl
    heldout_wanted = data is not None or (has_eval(run.plan) and not (preference or rl)) or not tasks
    if heldout_wanted and preference:
        raise preference_refusal(run)
    if heldout_wanted and rl and data is None:  # its rows are prompts, not text: --data names held-out text
        raise rl_refusal(run)
    plan = eval_plan(run, data) if heldout_wanted else run.plan
    if tasks:
        from gpuplan.after import lmeval

        lmeval.check_installed()
        lmeval.check_local(lmeval.task_manager(plan), tasks)
    from gpuplan.render.notices import log_to

    log_to(run.output_dir, load_libraries=True)  # library notices to the run's gpuplan-debug.log (render/notices.py)
    from gpuplan.after.evaluate import heldout_loss
    from gpuplan.after.load import load_trained
    from gpuplan.after.record import entry, record

    loaded = load_trained(run, echo=lambda s: print(s, file=sys.stderr))
    print(f"loaded {loaded.what} on {loaded.device}", file=sys.stderr)
    heldout = heldout_loss(plan, loaded) if heldout_wanted else None
    task_results = None
    if tasks:
        from gpuplan.after.lmeval import run_tasks

        task_results = run_tasks(plan, loaded)
    files = [data] if data else list(plan.resolved.data.eval_files) or None
    result = entry(run, files, heldout, task_results)
    path = record(run, result)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("\n".join(render_evaluation(result)))
    print(f"Recorded in {path} (gpuplan show {run.output_dir})")
    return 0


def preference_refusal(run) -> UserError:
    """A dpo / kto run's held-out loss is its objective's loss against the reference (TRL's
    DPOTrainer / KTOTrainer evaluate), not the next-token loss `gpuplan eval` scores (after/evaluate.py):
    refused, pointing at the eval loss the run logged, or at lm-eval tasks."""
    from gpuplan.apply.train.arguments import has_eval

    name = run.plan.resolved.training.objective.name
    metrics = os.path.join(run.output_dir, METRICS_FILE)
    if has_eval(run.plan):
        fix = f'read the {name} eval loss TRL computed at the run\'s eval steps: the "eval" lines of {metrics}'
    else:
        fix = (
            f"hold out {name} rows (data.eval_files or data.eval_fraction) and apply again: TRL's trainer logs its "
            f'{name} eval loss at each eval step ("eval" lines of metrics.jsonl); or set [eval] tasks for lm-eval'
        )
    return UserError(
        f'gpuplan eval scores the next-token loss of held-out text; this run trained training.objective = "{name}", '
        f"whose eval loss is TRL's {name} loss against the reference model, which gpuplan eval does not compute",
        key="training.objective",
        fix=fix,
    )


def rl_refusal(run) -> UserError:
    """A grpo / rloo run's rows are prompts scored by its rewards (TRL's GRPOTrainer / RLOOTrainer evaluate
    by generating and scoring, the "eval" lines of metrics.jsonl): no held-out text for the next-token loss
    `gpuplan eval` scores unless --data names some."""
    from gpuplan.apply.train.arguments import has_eval

    name = run.plan.resolved.training.objective.name
    metrics = os.path.join(run.output_dir, METRICS_FILE)
    seen = (
        f'TRL\'s eval rewards are the "eval" lines of {metrics}'
        if has_eval(run.plan)
        else "hold out prompt rows (data.eval_files or data.eval_fraction) for TRL's eval rewards"
    )
    return UserError(
        f'gpuplan eval scores the next-token loss of held-out text; this run trained training.objective = "{name}" '
        "on prompts scored by its rewards, and has no held-out text",
        key="training.objective",
        fix=f"pass --data FILE (text to score the trained model's next-token loss on), or set [eval] tasks for lm-eval; {seen}",
    )


def render_evaluation(e: dict) -> list[str]:
    where = e["data"] if isinstance(e["data"], str) else ", ".join(e["data"])
    step = f"step {e['step']}" + (" (checkpoint)" if e.get("checkpoint") is not None else "")
    lines = [f"Evaluated the model at {step}:"]
    if e.get("eval_loss") is not None:
        ppl = f", perplexity {e['perplexity']:.4f}" if e.get("perplexity") is not None else ""
        lines.append(f"  held-out loss {e['eval_loss']:.4f}{ppl} on {e.get('eval_sequences')} sequences of {where}")
    for task, metrics in (e.get("tasks") or {}).items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "examples" and isinstance(v, float))
        lines.append(f"  {task}: {shown} ({metrics.get('examples')} examples)")
    return lines
