"""training.objective = "dpo" | "kto": TRL's trainer, built from the same converted arguments.

TRL 1.16's DPOConfig / KTOConfig extend TrainingArguments, so the plan's TrainingArguments
kwargs (convert.py) are passed unchanged and only the objective's fields are added: beta,
loss_type, max_length, precompute_ref_log_probs. The trainer class and config class come
from the objective's descriptor (spec/objectives.py).

The reference, as the plan resolved preference.reference:
- adapters-off (lora / qlora): TRL wraps the prepared base with the plan's LoraConfig
  (peft_config=) and disables the adapters for the reference forward: no second copy;
- copy (full): a frozen deep copy of the starting weights in the policy's dtype, as TRL builds
  its own (trl/trainer/dpo_trainer.py: dtype=self.model.dtype): the same weights under the same
  autocast, so the first step's rewards are 0;
- model: the model at preference.reference_model, loaded in the policy's dtype (full) or, beside
  adapters, the compute dtype (the frozen base's);
- precomputed: TRL computes the reference log-probs once, with the starting weights,
  before the first step (precompute_ref_log_probs=True), and keeps no reference model.

KTO's row order: train_sampling / shuffled_rows (TRL keeps a KL term's batches in a fixed order).

Rows are checked before anything is written (check_rows: the plan's own check with the
run's tokenizer and chat template): an unusable row stops the run, it is never dropped.
"""

from __future__ import annotations

import copy
import os
import tempfile
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.checks.preference_rows import check_rows as count_unusable
from gpuplan.plan.checks.preference_rows import report_diagnostics
from gpuplan.plan.resolved import PreferenceRun
from gpuplan.plan.types import Plan
from gpuplan.spec.objectives import Objective, computes_kl


def objective_of(plan: Plan) -> Objective:
    return plan.resolved.training.objective


def preference_run(plan: Plan) -> PreferenceRun:
    """The [preference] settings of a preference plan, every one resolved (plan/resolved.py)."""
    run = plan.resolved.preference_run
    if run is None:
        raise ApplyError(
            f"training.objective = {plan.resolved.training.objective.name!r} trains no preference objective",
            key="training.objective",
            fix='re-run `gpuplan plan` on a spec with training.objective = "dpo" or "kto"',
        )
    return run


def uses_preference(plan: Plan) -> bool:
    return objective_of(plan).is_preference


def _prompt_counter(plan: Plan, tokenizer: Any):
    """Prompt tokens exactly as TRL counts them (trl/data_utils.py `_tokenize`: the tokenizer's special
    tokens; conversational prompts through the chat template with the generation prompt)."""
    from trl.data_utils import _tokenize

    if plan.resolved.data.format == "chat":
        from gpuplan.apply.data.chat import chat_template_of

        tokenizer.chat_template = chat_template_of(plan, tokenizer)

    def count(prompt: Any) -> int | None:
        if isinstance(prompt, list) and not tokenizer.chat_template:
            raise ApplyError(
                "a conversational row (a list of messages) needs a chat template",
                fix='set data.format = "chat" and data.chat_template = "chatml"',
            )
        extra = {"add_generation_prompt": True} if isinstance(prompt, list) else {}
        return len(_tokenize(tokenizer, prompt, **extra)["input_ids"])

    return count


def unpaired(plan: Plan, rows: Any) -> Any:
    """KTO on prompt / chosen / rejected rows: the labelled completions TRL trains on, two per pair (chosen:
    label true, rejected: false), made by TRL's own trl/data_utils.py `unpair_preference_dataset`, which
    KTOTrainer would apply itself (trl/trainer/kto_trainer.py `_prepare_dataset`: "Unpair the dataset if
    needed", when the first row has chosen and rejected). Done here so that the run counts and sees the
    examples it trains on. Other rows and objectives: unchanged."""
    if rows is None or not objective_of(plan).labelled_completions or not {"chosen", "rejected"} <= set(rows.column_names):
        return rows
    from trl.data_utils import unpair_preference_dataset

    return unpair_preference_dataset(rows)


def load_splits(plan: Plan, cache: str) -> tuple[Any, Any | None, list[str]]:
    """(train rows, eval rows or None, train paths) as `datasets` Datasets; KTO pairs unpaired (`unpaired`),
    after the eval split, so a pair's two completions stay in one split."""
    from gpuplan.apply.data.prepare import load_rows, split_eval, train_paths

    paths = train_paths(plan)
    raw, _ = load_rows(paths, "data.train_files", cache)
    train, ev = split_eval(plan, raw)
    return unpaired(plan, train), unpaired(plan, ev), paths


def check_rows(plan: Plan, tokenizer: Any) -> None:
    """Refuse, before the run writes anything, data with a row that cannot be trained on."""
    from gpuplan.apply.data.prepare import load_rows, train_paths

    obj = objective_of(plan)
    count = _prompt_counter(plan, tokenizer)
    limit = preference_run(plan).max_prompt_length
    splits = [("data.train_files", train_paths(plan))]
    if plan.resolved.data.eval_files:
        splits.append(("data.eval_files", list(plan.resolved.data.eval_files)))
    problems = []
    with tempfile.TemporaryDirectory(prefix="gpuplan-rows-") as cache:  # nothing in output.dir yet
        for key, paths in splits:
            rows, _ = load_rows(paths, key, cache)
            report = count_unusable(rows.to_list(), obj, limit, count)
            problems += report_diagnostics(report, key, ", ".join(paths), obj)
    if problems:
        first = problems[0]
        more = "; ".join(d.summary for d in problems[1:])
        raise ApplyError(first.summary + (f"; also: {more}" if more else ""), key=first.key, fix=first.fix)


def check_before_run(plan: Plan) -> None:
    """check_rows with the run's tokenizer (a Hub dataset's files were fetched before this)."""
    from gpuplan.apply.data.tokenizer import load_tokenizer
    from gpuplan.hub.fetch import model_dir

    tokenizer = load_tokenizer(
        model_dir(plan.resolved.model.hub),
        task="causal-lm",
        from_scratch=plan.resolved.model.from_scratch,
        trust_remote_code=plan.resolved.model.trust_remote_code,
    )
    check_rows(plan, tokenizer)


def config_kwargs(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    """The TrainingArguments kwargs plus the objective's DPOConfig / KTOConfig fields."""
    out = dict(base)
    pref = preference_run(plan)
    out.update(
        beta=pref.beta,
        loss_type=pref.loss_type,
        max_length=pref.max_length,
        precompute_ref_log_probs=pref.reference == "precomputed",
    )
    if objective_of(plan).config_sampling:
        out["train_sampling_strategy"] = train_sampling(plan)
    return out


def train_sampling(plan: Plan) -> str:
    """KTO's train sampler. KTOConfig defaults train_sampling_strategy to "sequential" for every loss, and
    KTOTrainer refuses any other for the losses with a KL term, "because the KL completion for each example
    is precomputed against its neighbors in a fixed-order batch" (trl/trainer/kto_config.py,
    kto_trainer.py `__init__`; `_prepare_dataset` rotates the completions within each per-device batch).
    Those keep it, and their rows are shuffled once before TRL batches them (shuffled_rows). apo_zero_unpaired
    has no KL term: the Trainer's random sampler, seeded by training.seed and reshuffled every epoch, as SFT's."""
    return "sequential" if computes_kl(objective_of(plan).name, preference_run(plan).loss_type) else "random"


def shuffled_rows(plan: Plan, train: Any) -> Any:
    """KTO with a KL term: the training rows in an order drawn from training.seed, before TRL's trainer
    builds its fixed batches from them (train_sampling): without it training.seed had no effect on what a
    step sees, and pairs unpaired by TRL (all the chosen completions of 1000 pairs, then all the rejected
    ones: trl/data_utils.py `_unpair_row`) gave batches of one label. Every epoch runs those batches in
    that order. Other objectives and apo_zero_unpaired: the Trainer's seeded random sampler."""
    if not objective_of(plan).config_sampling or train_sampling(plan) != "sequential":
        return train
    return train.shuffle(seed=plan.resolved.training.seed).flatten_indices()


def _compute_dtype(plan: Plan) -> Any:
    import torch

    from gpuplan.apply.train.arguments import torch_dtype

    if plan.resolved.training.bf16:
        return torch.bfloat16
    if plan.resolved.training.fp16:
        return torch.float16
    return torch_dtype(plan)


def reference_model(plan: Plan, model: Any) -> Any | None:
    """The frozen reference the plan chose; None when TRL needs none (adapters off, precomputed)."""
    from gpuplan.apply.model import adapters

    ref = preference_run(plan).reference
    dtype = _compute_dtype(plan) if adapters.uses_adapters(plan) else model.dtype  # memory/preference.py reference_element_bytes
    if ref == "copy":
        out = copy.deepcopy(model)  # the starting weights, before the first step, in the policy's dtype
    elif ref == "model":
        from transformers import AutoModelForCausalLM

        path = preference_run(plan).reference_model
        if path is None or not os.path.isdir(path):
            raise ApplyError(
                f"preference.reference_model = {path!r}: no such model directory",
                key="preference.reference_model",
                fix="point it at a directory with config.json and safetensors weights",
            )
        out = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    else:
        return None
    out.eval()
    out.requires_grad_(False)
    return out


def build(plan: Plan, model: Any, tokenizer: Any, train: Any, ev: Any, args_kwargs: dict[str, Any], callbacks: list[Any]) -> Any:
    """TRL's trainer for the plan's objective."""
    import trl

    from gpuplan.apply.model import adapters
    from gpuplan.apply.train.arguments import refusal_fix

    obj = objective_of(plan)
    if plan.resolved.data.format == "chat":
        from gpuplan.apply.data.chat import chat_template_of

        tokenizer.chat_template = chat_template_of(plan, tokenizer)  # TRL renders conversational rows with it
    from gpuplan.apply.train.fsdp_cpu import trainer_for

    config_cls = getattr(trl, obj.config_class)
    # TRL's trainers inherit the Trainer's accelerator set-up: on CPU ranks accelerate drops the FSDP plugin
    # for them as well (fsdp_cpu.py), so they get the same promotion
    trainer_cls = trainer_for(plan, getattr(trl, obj.trainer_class))
    try:
        args = config_cls(**config_kwargs(plan, args_kwargs))
    except (ValueError, ImportError) as e:
        raise ApplyError(f"the plan's training settings were refused by trl: {e}", fix=refusal_fix(plan, "trl", trl.__version__, e)) from e
    peft_config = None
    ref = None
    if adapters.uses_adapters(plan):
        # adapters-off needs no reference (TRL disables the adapters); a separate model is loaded
        # as the plan counted it (rules/preference.py), and TRL then uses it instead
        if preference_run(plan).reference == "model":
            ref = reference_model(plan, model)
        model = adapters.prepare_base(plan, model)
        peft_config = adapters.lora_config(plan)
    else:
        ref = reference_model(plan, model)
    try:
        trainer = trainer_cls(
            model=model,
            ref_model=ref,
            args=args,
            train_dataset=shuffled_rows(plan, train),
            eval_dataset=ev,
            processing_class=tokenizer,
            callbacks=callbacks,
            peft_config=peft_config,
        )
    except ValueError as e:
        if peft_config is not None and "arget modules" in str(e):
            raise adapters.target_error(plan, model, e) from e
        raise ApplyError(f"trl {obj.trainer_class} refused the plan: {e}", fix=refusal_fix(plan, "trl", trl.__version__, e)) from e
    if plan.resolved.model.method.quantized_base:  # (lora keeps peft's fp32 adapters; TRL casts only over a quantized base)
        fp32_adapters(trainer.model)
    if adapters.uses_adapters(plan):
        adapter_dropout(trainer.model, plan.resolved.lora.lora_dropout)
    return trainer


def adapter_dropout(model: Any, p: float) -> None:
    """lora.lora_dropout as planned (and priced: the dropped adapter inputs) on the adapters.

    TRL 1.16's disable_dropout (default True; trl/trainer/dpo_config.py, kto_config.py) sets p = 0 on
    every torch.nn.Dropout of the policy and the reference (trl/trainer/utils.py
    `disable_dropout_in_model`), peft's lora_dropout modules included. TRL's reason holds for the
    base model's own dropout (the policy's log-probs must be comparable with the reference's), which
    stays off; the adapter's dropout acts only on the adapter branch, which the adapters-off
    reference never runs, so the dropout the spec asked for is put back."""
    import torch

    for name, module in model.named_modules():
        if ".lora_dropout." in name and isinstance(module, torch.nn.Dropout):
            module.p = p


def fp32_adapters(model: Any) -> None:
    """The adapters in fp32, as the plan prices them and as peft makes them (get_peft_model's
    autocast_adapter_dtype=True) for an SFT run.

    TRL 1.16 casts every trainable parameter to bf16 when the base is quantized
    (trl/trainer/dpo_trainer.py and kto_trainer.py `__init__`, "When using QLoRA, the PEFT adapter
    weights are converted to bf16"): with no fp32 copy, an AdamW update below bf16's resolution is
    lost (at lr 5e-6 most lora_A entries do not move), and a T4 has no bf16 at all. The trainer
    builds its optimizer only in train(), so restoring fp32 here is what the optimizer steps.
    """
    import torch

    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.to(torch.float32)
