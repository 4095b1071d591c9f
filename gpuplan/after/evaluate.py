"""Held-out loss and perplexity of a trained run, with the masking training used.

The eval split is built by apply's own data code (apply/data/prepare.py prepare_data: the same
tokenizer, seq_len, packing, chat / instruction masks and, with data.eval_fraction, the
same seeded split), and scored by transformers.Trainer.evaluate, the call apply's eval
steps make: eval_loss is the mean over eval batches of the model's mean token loss on
the labels that are not -100. So for the final weights and the run's eval data,
`gpuplan eval` reproduces the last eval_loss apply logged, and perplexity is exp(eval_loss)
(causal-lm; for masked-lm the loss depends on the random masks and no perplexity is given).
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any

from gpuplan.after.finished_run import FinishedRun
from gpuplan.apply.model.generation import Loaded
from gpuplan.errors import UserError
from gpuplan.plan.types import Plan, Setting

EVAL_SUFFIXES = (".txt", ".text", ".jsonl", ".json", ".csv", ".parquet")  # apply/data/prepare.py BUILDERS


def with_value(plan: Plan, key: str, value: Any) -> Plan:
    return plan.with_settings({key: Setting(value, "user")})


def check_data_flag(path: str | None) -> str | None:
    """--data FILE as an absolute path, refused before anything loads when it cannot be read."""
    if path is None:
        return None
    if not os.path.isfile(path):
        raise UserError(f"--data {path}: no such file", fix="give a file of held-out rows in the training data's format")
    if os.path.splitext(path)[1].lower() not in EVAL_SUFFIXES:
        raise UserError(
            f"--data {path}: suffix {os.path.splitext(path)[1]!r} is not one of {', '.join(EVAL_SUFFIXES)}",
            fix="save the rows as .jsonl, .csv, .parquet or .txt",
        )
    if os.path.getsize(path) == 0:
        raise UserError(f"--data {path} is empty", fix="give a file holding at least one row")
    return os.path.abspath(path)


def eval_plan(run: FinishedRun, data_file: str | None) -> Plan:
    """The run's plan with --data as its eval files; refused when there is nothing held out."""
    from gpuplan.apply.train.arguments import has_eval

    plan = run.plan
    if data_file is not None:
        return with_value(with_value(plan, "data.eval_files", [data_file]), "data.eval_fraction", 0.0)
    if not has_eval(plan):
        raise UserError(
            "this run held out no eval data (data.eval_files and data.eval_fraction are unset)",
            key="data.eval_files",
            fix=f"give held-out rows: gpuplan eval {run.spec_path} --data FILE",
        )
    return plan


def heldout_loss(plan: Plan, loaded: Loaded) -> dict[str, Any]:
    """{eval_loss, perplexity, eval_sequences, eval_runtime_s} on the plan's eval split."""
    from transformers import PrinterCallback, Trainer, TrainingArguments, set_seed

    from gpuplan.apply.data.prepare import prepare_data

    set_seed(plan.resolved.training.seed)
    data = prepare_data(plan, loaded.tokenizer)
    assert data.eval is not None, "eval_plan refuses a plan without held-out rows"
    with tempfile.TemporaryDirectory(prefix="gpuplan-eval-") as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            use_cpu=loaded.device == "cpu",
            report_to="none",
            disable_tqdm=True,
            per_device_eval_batch_size=plan.resolved.training.per_device_eval_batch_size,
            bf16=plan.resolved.training.bf16,
            fp16=plan.resolved.training.fp16 and loaded.device == "cuda",
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
            seed=plan.resolved.training.seed,
        )
        trainer = Trainer(
            model=loaded.model, args=args, eval_dataset=data.eval, data_collator=data.collator, processing_class=loaded.tokenizer
        )
        trainer.remove_callback(PrinterCallback)  # the numbers are printed once, by the command
        metrics = trainer.evaluate()
    loss = float(metrics["eval_loss"])
    causal = plan.resolved.model.task == "causal-lm"
    return {
        "eval_loss": loss,
        "perplexity": _exp(loss) if causal else None,
        "eval_sequences": len(data.eval),
        "eval_runtime_s": metrics.get("eval_runtime"),
    }


def _exp(x: float) -> float | None:
    try:
        return math.exp(x)
    except OverflowError:
        return None
