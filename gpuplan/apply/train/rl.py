"""training.objective = "grpo" | "rloo": TRL's GRPOTrainer / RLOOTrainer, built from the same converted arguments.

TRL 1.16's GRPOConfig / RLOOConfig extend TrainingArguments (trl/trainer/base_config.py _BaseConfig), so the
plan's TrainingArguments kwargs (arguments.py) are passed unchanged, which also overrides _BaseConfig's own
defaults (gradient_checkpointing True, bf16 True unless fp16, logging_steps 10) with the plan's values; only
the objective's fields from plan.resolved.rl are added (num_generations, max_completion_length, temperature,
top_p, beta, loss_type for grpo, generation_batch_size, the generation backend, reward_weights).

What the trainers do with the model (trl/trainer/grpo_trainer.py and rloo_trainer.py `__init__`), read back by
the audit (audit.py):
- adapters: the plan's LoraConfig is passed as peft_config and TRL wraps the prepared base; with beta > 0 the
  reference is that base with the adapters disabled (no copy, no "ref" adapter: TRL adds one only to a model
  that is already a PeftModel). Over a 4-bit base TRL casts the trainable parameters to bf16; they are put
  back in fp32 as the plan prices them (preference.fp32_adapters).
- full fine-tune with beta > 0: TRL loads the reference itself from the model's path
  (create_model_from_path(get_config_model_id(model.config)), in the policy's dtype and attention kernel):
  the base's weights, also when a run resumes. Its parameters come trainable (TRL runs it under no_grad):
  apply freezes them, as the plan counts the reference;
- dropout: GRPOConfig / RLOOConfig disable_dropout defaults to False, so the model's own dropout and
  lora_dropout run as planned (unlike DPO / KTO, preference.adapter_dropout);
- generation: use_vllm False is model.generate on the training device; a vLLM backend runs only on GPUs
  (`check_before_run` refuses it on CPU: never a silent fall-back to transformers generation).

TRL 1.16 has no max_prompt_length (prompts are never truncated), so the rows are checked before the run
writes anything (`check_rows`): every prompt within rl.max_prompt_length tokens counted as the trainer
tokenizes it, the columns every reward reads present, and each reward called once on the first round.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.resolved import RlSettings
from gpuplan.plan.types import Plan

SHOWN_ROWS = 5  # row numbers named in an error


def uses_rl(plan: Plan) -> bool:
    return plan.resolved.training.objective.is_rl


def rl_run(plan: Plan) -> RlSettings:
    """plan.resolved.rl of a grpo / rloo plan."""
    obj = plan.resolved.training.objective
    if not obj.is_rl:
        raise ApplyError(
            f"training.objective = {obj.name!r} is not an online RL objective",
            key="training.objective",
            fix='re-run `gpuplan plan` on a spec with training.objective = "grpo" or "rloo"',
        )
    return plan.resolved.rl


def check_backend(plan: Plan) -> None:
    """vLLM generates only on GPUs: refused on CPU with the reason, never replaced by transformers generation."""
    rl = rl_run(plan)
    if rl.use_vllm and plan.hardware.is_cpu:
        raise ApplyError(
            f"rl.generation_backend = {rl.generation_backend!r}: vLLM runs only on GPUs (its engine needs CUDA), and "
            "this plan is for the CPU; gpuplan does not switch to another backend by itself",
            key="rl.generation_backend",
            fix='set rl.generation_backend = "transformers" for a CPU run (model.generate), or plan for a GPU',
        )


# ---- the rows ------------------------------------------------------------------------------------


def load_splits(plan: Plan, cache: str) -> tuple[Any, Any | None, list[str]]:
    """(train rows, eval rows or None, train paths) as `datasets` Datasets, the prompt column as written."""
    from gpuplan.apply.data.prepare import load_rows, split_eval, train_paths

    paths = train_paths(plan)
    raw, _ = load_rows(paths, "data.train_files", cache)
    train, ev = split_eval(plan, raw)
    return train, ev, paths


def _is_messages(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in v)


def prompt_counter(plan: Plan, tokenizer: Any):
    """Prompt tokens as TRL 1.16's trainers tokenize them (grpo_trainer.py / rloo_trainer.py `_tokenize_prompts`):
    a plain prompt with the tokenizer's special tokens, a conversational one through the chat template with
    the generation prompt."""
    if plan.resolved.data.format == "chat":
        from gpuplan.apply.data.chat import chat_template_of

        tokenizer.chat_template = chat_template_of(plan, tokenizer)

    def count(prompt: Any) -> int:
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(conversation=[prompt], add_generation_prompt=True, tokenize=True, return_dict=True)
            return len(ids["input_ids"][0])
        return len(tokenizer(text=[prompt])["input_ids"][0])

    return count


def _rows_named(rows: list[int], n: int) -> str:
    """ "row 4" / "rows 1, 2, ...": 1-based, as the plan's own row check names them (plan/rules/rl.py)."""
    shown = ", ".join(str(i + 1) for i in rows[:SHOWN_ROWS])
    return f"row{'s' if n > 1 else ''} {shown}" + (", ..." if n > SHOWN_ROWS else "")


def check_split(plan: Plan, rows: Any, key: str, where: str, count: Any) -> None:
    """Every row of one split usable as the plan sized it; an ApplyError naming the first kind of bad row."""
    rl = rl_run(plan)
    name = plan.resolved.training.objective.name
    columns = list(rows.column_names)
    if "prompt" not in columns:
        raise ApplyError(
            f'{key}: the rows of {where} have no "prompt" column (columns: {", ".join(columns)})',
            key=key,
            fix=f'a {name} row is a prompt: {{"prompt": "..."}} or {{"prompt": [{{"role": "user", "content": "..."}}]}}, '
            "with the columns the rewards read beside it",
        )
    for i, entry in enumerate(rl.rewards):
        if entry.kind == "exact-match" and entry.column not in columns:
            raise ApplyError(
                f"rl.rewards[{i}] ({entry.name}) reads column {entry.column!r}, which the rows of {where} do not have "
                f"(columns: {', '.join(columns)})",
                key=f"rl.rewards[{i}].column",
                fix="set column to the dataset column holding the reference answer, or add it to every row",
            )
    bad: dict[str, list[int]] = {}
    conversational = 0
    prompts = rows["prompt"]
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if not prompt.strip():
                bad.setdefault("have an empty prompt", []).append(i)
        elif _is_messages(prompt):
            conversational += 1
        else:
            bad.setdefault("have a prompt that is neither text nor a list of {role, content} messages", []).append(i)
    if conversational and conversational < len(prompts):
        plain = [i for i, p in enumerate(prompts) if not isinstance(p, list)]
        bad.setdefault("have a plain prompt among conversational ones (TRL renders a batch by its first row's kind)", []).extend(plain)
    for problem, at in bad.items():
        raise ApplyError(
            f"{key}: {len(at)} of {len(prompts)} {name} rows in {where} {problem} ({_rows_named(at, len(at))})",
            key=key,
            detail="gpuplan drops no row silently: every row is trained on or reported",
            fix='give every row a "prompt": text, or a list of {role, content} messages (one kind for the whole file)',
        )
    limit = int(rl.max_prompt_length or 0)
    lengths = [count(p) for p in prompts]
    long = [i for i, n in enumerate(lengths) if n > limit]
    if long:
        longest = max(lengths)
        raise ApplyError(
            f"{key}: {len(long)} of {len(prompts)} prompts in {where} are longer than rl.max_prompt_length = {limit} tokens "
            f"({_rows_named(long, len(long))}; the longest has {longest}), counted as {plan.resolved.training.objective.trainer_class} "
            "tokenizes them: TRL does not truncate them, so the step would run longer sequences than planned",
            key=key,
            detail="gpuplan drops no row silently: every row is trained on or reported",
            fix=f"set rl.max_prompt_length = {longest} and re-run `gpuplan plan`, or shorten those prompts",
        )


def check_rows(plan: Plan, tokenizer: Any) -> None:
    """Refuse, before the run writes anything: a row the trainer cannot use or the plan did not size, and a
    reward that fails on the first round's rows (rewards.check_on_first_batch)."""
    from gpuplan.apply.data.prepare import load_rows, train_paths
    from gpuplan.apply.train import rewards

    count = prompt_counter(plan, tokenizer)
    splits = [("data.train_files", train_paths(plan))]
    if plan.resolved.data.eval_files:
        splits.append(("data.eval_files", list(plan.resolved.data.eval_files)))
    loaded = rewards.build_rewards(plan)  # a missing file or function first: nothing else is worth reading then
    with tempfile.TemporaryDirectory(prefix="gpuplan-rows-") as cache:  # nothing in output.dir yet
        first = None
        for key, paths in splits:
            rows, _ = load_rows(paths, key, cache)
            _conversational_needs_template(rows, tokenizer, key, ", ".join(paths))
            check_split(plan, rows, key, ", ".join(paths), count)
            if first is None:
                first = rows
        rewards.check_on_first_batch(loaded, first, plan)


def _conversational_needs_template(rows: Any, tokenizer: Any, key: str, where: str) -> None:
    if "prompt" in rows.column_names and len(rows) and isinstance(rows[0]["prompt"], list) and not tokenizer.chat_template:
        raise ApplyError(
            f"{key}: the prompts of {where} are conversations (lists of messages), and the tokenizer has no chat template",
            key="data.format",
            fix='set data.format = "chat" and data.chat_template = "chatml" (or a Jinja file)',
        )


def check_before_run(plan: Plan) -> None:
    """The backend and check_rows with the run's tokenizer (a Hub dataset's files were fetched before this)."""
    from gpuplan.apply.data.tokenizer import load_tokenizer
    from gpuplan.hub.fetch import model_dir

    check_backend(plan)
    tokenizer = load_tokenizer(
        model_dir(plan.resolved.model.hub),
        task="causal-lm",
        from_scratch=plan.resolved.model.from_scratch,
        trust_remote_code=plan.resolved.model.trust_remote_code,
    )
    check_rows(plan, tokenizer)


# ---- the trainer ---------------------------------------------------------------------------------


def config_kwargs(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    """The TrainingArguments kwargs plus the objective's GRPOConfig / RLOOConfig fields."""
    rl = rl_run(plan)
    obj = plan.resolved.training.objective
    out = dict(base)
    out.update(
        num_generations=rl.num_generations,
        max_completion_length=rl.max_completion_length,
        temperature=rl.temperature,
        top_p=rl.top_p,
        beta=rl.beta,
        generation_batch_size=rl.generation_batch_size,
        reward_weights=rl.reward_weights,
        use_vllm=rl.use_vllm,
    )
    if obj.loss_types:  # rloo has no loss_type (rloo_config.py)
        out["loss_type"] = rl.loss_type
    if rl.use_vllm:
        out.update(
            vllm_mode=rl.vllm_mode,
            vllm_tensor_parallel_size=rl.vllm_tensor_parallel_size,
            vllm_enable_sleep_mode=rl.vllm_enable_sleep_mode,
        )
        if rl.vllm_gpu_memory_utilization is not None:
            out["vllm_gpu_memory_utilization"] = rl.vllm_gpu_memory_utilization
    return out


def build(plan: Plan, model: Any, tokenizer: Any, train: Any, ev: Any, args_kwargs: dict[str, Any], callbacks: list[Any]) -> Any:
    """TRL's trainer for the plan's objective, with the plan's rewards."""
    import trl

    from gpuplan.apply.model import adapters
    from gpuplan.apply.train import rewards
    from gpuplan.apply.train.arguments import refusal_fix
    from gpuplan.apply.train.fsdp_cpu import trainer_for
    from gpuplan.apply.train.preference import fp32_adapters

    check_backend(plan)
    obj = plan.resolved.training.objective
    if plan.resolved.data.format == "chat":
        from gpuplan.apply.data.chat import chat_template_of

        tokenizer.chat_template = chat_template_of(plan, tokenizer)  # TRL renders conversational prompts with it
    config_cls = getattr(trl, obj.config_class)
    trainer_cls = trainer_for(plan, getattr(trl, obj.trainer_class))  # accelerate's FSDP drop on CPU ranks (fsdp_cpu.py)
    try:
        args = config_cls(**config_kwargs(plan, args_kwargs))
    except (ValueError, ImportError) as e:
        raise ApplyError(f"the plan's training settings were refused by trl: {e}", fix=refusal_fix(plan, "trl", trl.__version__, e)) from e
    peft_config = None
    if adapters.uses_adapters(plan):
        model = adapters.prepare_base(plan, model)
        peft_config = adapters.lora_config(plan)
    elif rl_run(plan).beta:
        _check_reference_source(plan, model)
    try:
        trainer = trainer_cls(
            model=model,
            reward_funcs=rewards.build_rewards(plan),
            args=args,
            train_dataset=train,
            eval_dataset=ev,
            processing_class=tokenizer,
            callbacks=callbacks,
            peft_config=peft_config,
        )
    except ValueError as e:
        if peft_config is not None and "arget modules" in str(e):
            raise adapters.target_error(plan, model, e) from e
        raise ApplyError(f"trl {obj.trainer_class} refused the plan: {e}", fix=refusal_fix(plan, "trl", trl.__version__, e)) from e
    if plan.resolved.model.method.quantized_base:  # TRL casts the adapters to bf16 over a 4-bit base
        fp32_adapters(trainer.model)
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        # TRL loads the reference with trainable parameters (create_model_from_path; accelerate's
        # prepare_model(evaluation_mode=True) leaves requires_grad as it is) and runs it under torch.no_grad:
        # frozen here, as the plan counts it (no gradients, outside the optimizer), whatever a later TRL does
        ref.requires_grad_(False)
    return trainer


def _check_reference_source(plan: Plan, model: Any) -> None:
    """A full fine-tune's reference is loaded by TRL from the model's path (grpo_trainer.py `__init__`): a model
    built from a config has none."""
    import os

    path = getattr(model.config, "_name_or_path", None)
    if not path or not os.path.isdir(path):
        raise ApplyError(
            f"rl.beta = {rl_run(plan).beta}: TRL {plan.resolved.training.objective.trainer_class} loads the reference "
            f"model from the policy's path, and this model has no saved weights to load ({path or 'built from a config'})",
            key="rl.beta",
            fix="set rl.beta = 0 (no reference), or fine-tune a saved model (model.name_or_path)",
        )


def preview_prompts(plan: Plan, tokenizer: Any, n_examples: int) -> dict[str, Any]:
    """`gpuplan data` for grpo / rloo rows: each prompt as the trainer tokenizes it (masked: the loss covers only
    the completions it generates), after the same row check as apply, in apply/data/preview.py's shape."""
    from gpuplan.apply.data.examples import segments_of
    from gpuplan.apply.data.prepare import cache_dir, load_rows, train_paths

    rl = rl_run(plan)
    count = prompt_counter(plan, tokenizer)
    paths = train_paths(plan)
    with tempfile.TemporaryDirectory(prefix="gpuplan-rows-") as cache:
        rows, _ = load_rows(paths, "data.train_files", cache)
        _conversational_needs_template(rows, tokenizer, "data.train_files", ", ".join(paths))
        check_split(plan, rows, "data.train_files", ", ".join(paths), count)
    raw, _ = load_rows(paths, "data.train_files", cache_dir(plan))
    examples: list[dict[str, Any]] = []
    tokens = 0
    for i, prompt in enumerate(raw["prompt"]):
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(conversation=[prompt], add_generation_prompt=True, tokenize=True, return_dict=True)
            ids = list(ids["input_ids"][0])
        else:
            ids = list(tokenizer(text=[prompt])["input_ids"][0])
        tokens += len(ids)
        if len(examples) < n_examples:
            examples.append(
                {
                    "row": i,
                    "kind": "prompt",
                    "tokens": len(ids),
                    "truncated": False,
                    "segments": segments_of(ids, [False] * len(ids), tokenizer),
                }
            )
    stats = {
        "rows": len(raw),
        "examples": len(raw),
        "dropped_rows": 0,
        "truncated_rows": 0,
        "tokens": tokens,
        "trained_tokens": 0,  # the completions, generated in the run: rl.num_generations x up to rl.max_completion_length each
        "sequences": len(raw) * int(rl.num_generations or 0),
        "seq_len": rl.sequence_length,
        "packing": False,
        "packing_efficiency": None,
    }
    return {"examples": examples, "stats": stats}
