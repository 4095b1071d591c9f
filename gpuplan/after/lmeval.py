"""lm-evaluation-harness tasks on the trained model ([eval] tasks; the optional `eval` extra).

Offline only, like the rest of gpuplan after the Hub files are fetched: HF_HUB_OFFLINE and
HF_DATASETS_OFFLINE are set before lm-eval loads a task. A task whose data are local
files (dataset_path: json / csv / parquet / text with dataset_kwargs.data_files) or a
Hub dataset already in the local cache runs; one that would need a download is refused
with its name and the dataset it reads. eval.include_path adds a folder of task YAML
files (lm-eval TaskManager include_path); without it only lm-eval's own tasks exist.
The model is passed in as loaded (lm_eval.models.huggingface.HFLM accepts a model object),
so an adapter run is scored on its base exactly as `generate` runs it.
"""

from __future__ import annotations

import os
from typing import Any

from gpuplan.apply.model.generation import Loaded
from gpuplan.errors import Diagnostic, GpuplanError, UserError
from gpuplan.plan.types import Plan

LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
_INSTALL = "pip install 'gpuplan[eval]' (or pip install lm-eval)"


def check_installed() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise UserError(
            "eval.tasks needs lm-evaluation-harness, which is not installed",
            key="eval.tasks",
            fix=f"{_INSTALL}, or remove eval.tasks to score the held-out loss only",
        ) from None


def task_manager(plan: Plan) -> Any:
    """lm-eval's TaskManager: eval.include_path's tasks, and lm-eval's own when a task is not there."""
    from lm_eval.tasks import TaskManager

    include = plan.resolved.eval.include_path
    if include is not None and not os.path.isdir(include):
        raise UserError(
            f"eval.include_path = {include!r} is not a folder",
            key="eval.include_path",
            fix="point it at the folder holding the task YAML files",
        )
    local = TaskManager(include_path=include, include_defaults=False, verbosity="ERROR") if include else None
    tasks = list(plan.resolved.eval.tasks)
    if local is not None and all(t in local.all_tasks for t in tasks):
        return local
    full = TaskManager(include_path=include, verbosity="ERROR")
    unknown = [t for t in tasks if t not in full.all_tasks]
    if unknown:
        where = f" in {include} or" if include else ""
        raise UserError(
            f"eval.tasks: {', '.join(map(repr, unknown))} is no lm-eval task{where} among lm-eval's own",
            key="eval.tasks",
            fix="check the name (`lm_eval ls tasks` lists lm-eval's), or put its YAML file in eval.include_path",
        )
    return full


def check_local(tm: Any, tasks: list[str]) -> None:
    """Refuse, naming the task, what would read missing local files or download a dataset."""
    from lm_eval.tasks import get_task_dict

    problems = []
    for name in tasks:
        cfg = getattr(tm.task_index.get(name), "cfg", None) or {}
        path = cfg.get("dataset_path")
        files = (cfg.get("dataset_kwargs") or {}).get("data_files")
        if path in LOCAL_BUILDERS and files:
            listed = files.values() if isinstance(files, dict) else files if isinstance(files, list) else [files]
            flat = [f for v in listed for f in (v if isinstance(v, list) else [v])]
            missing = [f for f in flat if isinstance(f, str) and not os.path.exists(f)]
            if missing:
                problems.append(
                    f"task {name!r} reads {', '.join(missing)}, which does not exist "
                    "(lm-eval reads data_files relative to the working directory)"
                )
            continue
        try:
            get_task_dict([name], tm)  # offline: loads from the local cache, or raises
        except (ConnectionError, OSError, ValueError, FileNotFoundError) as e:
            problems.append(f"task {name!r} needs the dataset {path!r}, which is not available offline ({e})")
    if problems:
        raise GpuplanError(
            [
                Diagnostic(
                    "error",
                    "eval.tasks",
                    p,
                    fix="give the task local data files (dataset_path: json, dataset_kwargs: {data_files: ...}) in "
                    "eval.include_path, or download the dataset into the Hugging Face cache first",
                )
                for p in problems
            ]
        )


def run_tasks(plan: Plan, loaded: Loaded) -> dict[str, dict[str, Any]]:
    """{task: {metric: value}} (lm-eval's "acc,none" keys shortened to "acc")."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    check_installed()
    tasks = list(plan.resolved.eval.tasks)
    tm = task_manager(plan)
    check_local(tm, tasks)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(
        pretrained=loaded.model,
        tokenizer=loaded.tokenizer,
        device=loaded.device,
        batch_size=plan.resolved.training.per_device_eval_batch_size,
    )
    with loaded.autocast():
        out = simple_evaluate(
            model=lm,
            tasks=tasks,
            task_manager=tm,
            num_fewshot=plan.resolved.eval.num_fewshot,
            limit=plan.resolved.eval.limit,
            log_samples=False,
            bootstrap_iters=0,
            random_seed=plan.resolved.training.seed,
        )
    results: dict[str, dict[str, Any]] = {}
    for task, metrics in (out or {}).get("results", {}).items():
        results[task] = {
            k.split(",")[0]: v
            for k, v in metrics.items()
            if "," in k and isinstance(v, (int, float)) and not k.split(",")[0].endswith("_stderr")
        }
        results[task]["examples"] = metrics.get("sample_len")
    return results
