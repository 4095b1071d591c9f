"""The rewards of a grpo / rloo run (plan.resolved.rl.rewards) as the callables TRL's trainer scores with.

TRL 1.16 calls every reward function once per generation round (trl/trainer/grpo_trainer.py and
rloo_trainer.py `_calculate_rewards`) as

    reward(prompts=[...], completions=[...], completion_ids=[[...], ...], <every other dataset column>=[...],
           trainer_state=TrainerState, log_extra=callable, log_metric=callable)

one list entry per completion (each prompt repeated num_generations times), and wants one float, or None
("no reward for this one", NaN in the metrics), per completion. A completion is a string for plain prompts
and [{"role": "assistant", "content": "..."}] for conversational ones. The trainer logs each reward's mean and
std as rewards/<name>/mean and rewards/<name>/std, the name being the callable's __name__
(trl/trainer/utils.py `get_callable_name`): each Reward here carries the plan's name.

The built-ins (plan/resolved.py RewardEntry) are plain Python, no torch:
- exact-match: 1.0 when the completion's answer (the first group of `pattern` searched in it, else the
  whole completion, stripped) equals str(row[column]).strip(), else 0.0;
- regex: 1.0 when re.search(pattern, completion), else 0.0;
- length: -max(0, completion tokens - target_length) / target_length (0 up to target_length tokens).
A "function" reward is the user's `name` in the plan's file (made absolute from "file.py:name" beside the
spec), loaded here as a module of its own, its directory first on sys.path while it loads (so it can import
the files beside it).

A reward that raises is a RewardError (an ApplyError: exit 1, no traceback) naming the reward, its file and
the exception. `check_on_first_batch` calls every reward once on the first round's rows before the run writes
anything, so a reward that cannot score them stops the run with nothing in output.dir.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib.util
import inspect
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.resolved import RewardEntry
from gpuplan.plan.types import Plan

# the keywords TRL passes besides prompts and completions and the dataset's columns (grpo_trainer.py
# `_calculate_rewards`: completion_ids, trainer_state, log_extra, log_metric; `environments` only with an
# environment_factory, which gpuplan does not pass)
TRL_KEYWORDS = ("completion_ids", "trainer_state", "log_extra", "log_metric")
# the dataset columns TRL does not pass to rewards as keywords (`_calculate_rewards`: every key of a row but these)
NOT_PASSED = ("prompt", "completion", "completion_ids")


class RewardError(ApplyError):
    """A reward function failed or returned something TRL cannot use."""


def completion_text(completion: Any) -> str:
    """The text of one completion: the string, or the contents of a conversational completion's messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
    return str(completion)


# ---- the built-ins ------------------------------------------------------------------------------


def answer_of(text: str, pattern: re.Pattern[str] | None) -> str | None:
    """The answer of a completion: the first group of `pattern`'s first match (None without a match), else
    the whole text; stripped."""
    if pattern is None:
        return text.strip()
    m = pattern.search(text)
    if m is None:
        return None
    group = m.group(1)
    return None if group is None else group.strip()


def exact_match(column: str, pattern: str | None = None) -> Callable[..., list[float]]:
    """1.0 per completion whose answer equals the row's `column`, else 0.0."""
    compiled = re.compile(pattern) if pattern is not None else None

    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        if column not in kwargs:
            present = sorted(k for k in kwargs if k not in TRL_KEYWORDS)
            raise KeyError(f"the rows have no column {column!r} (columns: {', '.join(present) or 'none besides prompt'})")
        out = []
        for completion, want in zip(completions, kwargs[column], strict=True):
            got = answer_of(completion_text(completion), compiled)
            out.append(1.0 if got is not None and want is not None and got == str(want).strip() else 0.0)
        return out

    return reward


def regex_match(pattern: str) -> Callable[..., list[float]]:
    """1.0 per completion in which `pattern` is found (re.search), else 0.0."""
    compiled = re.compile(pattern)

    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        return [1.0 if compiled.search(completion_text(c)) else 0.0 for c in completions]

    return reward


def length_penalty(target_length: int) -> Callable[..., list[float]]:
    """-max(0, tokens - target_length) / target_length per completion, from the completion's token ids."""

    def reward(prompts: list, completions: list, completion_ids: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> list[float]:
        if completion_ids is None:
            raise KeyError("TRL passed no completion_ids")
        return [-max(0, len(ids) - target_length) / target_length for ids in completion_ids]

    return reward


# ---- loading -------------------------------------------------------------------------------------


class Reward:
    """One planned reward as TRL calls it: `fn` under the plan's name, its failures as RewardError."""

    def __init__(self, entry: RewardEntry, index: int, fn: Callable[..., Any], source: str):
        self.entry = entry
        self.index = index
        self.fn = fn
        self.source = source  # how an error names where the reward lives: "built-in exact-match" or the file
        self.__name__ = entry.name  # TRL's metric name: rewards/<name>/mean (trl/trainer/utils.py get_callable_name)

    @property
    def key(self) -> str:
        return f"rl.rewards[{self.index}]"

    @property
    def label(self) -> str:
        return f"reward {self.entry.name!r} ({self.source})"

    def failed(self, e: BaseException, when: str) -> RewardError:
        return RewardError(
            f"{self.key}: {self.label} raised {type(e).__name__}: {e} {when}",
            key=self.key,
            fix="fix the reward so that it returns one number (or None) per completion for every batch, then re-run `gpuplan apply`"
            if self.entry.kind == "function"
            else "check the reward's settings against the rows (rl.rewards in the spec), then re-run `gpuplan plan`",
        )

    def checked(self, out: Any, n: int, when: str) -> list[float | None]:
        """`out` as TRL takes it, or a RewardError saying what it is instead."""
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
            raise RewardError(
                f"{self.key}: {self.label} returned {type(out).__name__} {when}, not a list of one number per completion",
                key=self.key,
                fix=f"return a list of {n} floats (or None for a completion it does not score)",
            )
        if len(out) != n:
            raise RewardError(
                f"{self.key}: {self.label} returned {len(out)} values for {n} completions {when}",
                key=self.key,
                fix="return exactly one value per completion (TRL repeats each prompt num_generations times)",
            )
        values: list[float | None] = []
        for v in out:
            if v is None:
                values.append(None)
            elif isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
                raise RewardError(
                    f"{self.key}: {self.label} returned {v!r} ({type(v).__name__}) {when}, not a number",
                    key=self.key,
                    fix="return a float (or None) per completion",
                )
            else:
                values.append(float(v))
        return values

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        when = _when(kwargs.get("trainer_state"))
        try:
            out = self.fn(prompts=prompts, completions=completions, **kwargs)
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported with its name
            raise self.failed(e, when) from e
        return self.checked(out, len(completions), when)


class AsyncReward(Reward):
    """An `async def` user reward: TRL runs it on its event loop (trl/trainer/utils.py is_async_callable reads
    the coroutine-ness of __call__)."""

    async def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        when = _when(kwargs.get("trainer_state"))
        try:
            out = await self.fn(prompts=prompts, completions=completions, **kwargs)
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self.failed(e, when) from e
        return self.checked(out, len(completions), when)


def _when(state: Any) -> str:
    step = getattr(state, "global_step", None)
    return "on the first batch" if not step else f"at step {step + 1}"


def load_function(entry: RewardEntry, index: int) -> Callable[..., Any]:
    """The user's function of a "function" reward, checked: the file loads, the name is a function there, and
    it takes TRL's keywords."""
    key = f"rl.rewards[{index}].function"
    path, name = entry.function_file, entry.function_name
    if not path or not name:
        raise ApplyError(f'{key} = {entry.function!r} is not "file.py:function"', key=key, fix="re-run `gpuplan plan` on the spec")
    if not os.path.isfile(path):
        raise ApplyError(
            f"{key}: the reward file {path} does not exist",
            key=key,
            fix="put the file back beside the spec (or correct the path in the spec), then re-run `gpuplan plan`",
        )
    module_name = f"gpuplan_reward_{index}_{re.sub(r'[^0-9A-Za-z_]', '_', os.path.splitext(os.path.basename(path))[0])}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ApplyError(f"{key}: {path} cannot be loaded as a Python module", key=key, fix="name a .py file")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - a SyntaxError, an ImportError, anything the file raises at import
        raise ApplyError(
            f"{key}: loading the reward file {path} raised {type(e).__name__}: {e}", key=key, fix=f"fix {path} so that it imports"
        ) from e
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    fn = getattr(module, name, None)
    if fn is None:
        names = [
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name
        ]
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        have = f"its functions: {', '.join(sorted(names))}" if names else "it defines no function"
        raise ApplyError(
            f"{key}: {path} has no function {name!r} ({have})",
            key=key,
            fix=f"{hint}name a function of {os.path.basename(path)} after the colon in the spec, then re-run `gpuplan plan`",
        )
    if not callable(fn):
        raise ApplyError(f"{key}: {name} in {path} is a {type(fn).__name__}, not a function", key=key, fix="name a function")
    check_signature(fn, key, f"{name} in {path}")
    return fn


def check_signature(fn: Callable[..., Any], key: str, what: str) -> None:
    """TRL calls a reward with prompts=, completions= and more keywords: it must take **kwargs, or name every
    keyword TRL passes (the dataset's columns are checked by the first batch, check_on_first_batch)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable: the first batch shows whether it takes TRL's call
    params = sig.parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    missing = [] if var_kw else [n for n in ("prompts", "completions", *TRL_KEYWORDS) if n not in named]
    if missing:
        takes = ", ".join(params) or "no arguments"
        raise ApplyError(
            f"{key}: {what} takes ({takes}), not TRL's reward signature (prompts, completions, **kwargs)",
            key=key,
            fix=f"define it as `def {getattr(fn, '__name__', 'reward')}(prompts, completions, **kwargs)`: TRL passes "
            f"{', '.join(TRL_KEYWORDS)} and every dataset column as keywords",
        )


def build_rewards(plan: Plan) -> list[Reward]:
    """The plan's rewards, in order (their weights are GRPOConfig.reward_weights in the same order)."""
    rl = plan.resolved.rl
    out: list[Reward] = []
    for i, entry in enumerate(rl.rewards):
        fn: Callable[..., Any]
        if entry.kind == "exact-match":
            if not entry.column:
                raise ApplyError(f"rl.rewards[{i}].column is not set: exact-match needs the answer's column", key=f"rl.rewards[{i}].column")
            fn, source = exact_match(entry.column, entry.pattern), "built-in exact-match"
        elif entry.kind == "regex":
            if not entry.pattern:
                raise ApplyError(f"rl.rewards[{i}].pattern is not set: regex needs a pattern", key=f"rl.rewards[{i}].pattern")
            fn, source = regex_match(entry.pattern), "built-in regex"
        elif entry.kind == "length":
            target = entry.target_length or max(1, rl.max_completion_length // 2)  # the spec's default (schema.py)
            fn, source = length_penalty(target), "built-in length"
        else:
            fn, source = load_function(entry, i), str(entry.function_file)
        cls = AsyncReward if inspect.iscoroutinefunction(fn) else Reward
        out.append(cls(entry, i, fn, source))
    return out


# ---- the check before the run --------------------------------------------------------------------


def first_round(rows: Any, plan: Plan) -> list[dict[str, Any]]:
    """The rows of the first generation round as TRL hands them to the rewards: generation_batch_size /
    num_generations prompts (the first rows), each num_generations times."""
    rl = plan.resolved.rl
    groups = max(1, (rl.generation_batch_size or 0) // (rl.num_generations or 1))
    first = [rows[i] for i in range(min(groups, len(rows)))]
    return [dict(r) for r in first for _ in range(rl.num_generations or 1)]


def reward_call(batch: list[dict[str, Any]]) -> tuple[list, list, dict[str, Any]]:
    """(prompts, completions, keywords) of TRL's call on `batch`, each completion empty: a string for plain
    prompts, one assistant message for conversational ones (trl/data_utils.py is_conversational)."""
    from transformers import TrainerState

    prompts = [r["prompt"] for r in batch]
    conversational = bool(prompts) and isinstance(prompts[0], list)
    completions: list = [[{"role": "assistant", "content": ""}] if conversational else "" for _ in batch]
    columns = [k for k in batch[0] if k not in NOT_PASSED] if batch else []
    kwargs: dict[str, Any] = {k: [r[k] for r in batch] for k in columns}
    kwargs.update(
        completion_ids=[[] for _ in batch],
        trainer_state=TrainerState(),
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
    )
    return prompts, completions, kwargs


def check_on_first_batch(rewards: list[Reward], rows: Any, plan: Plan) -> None:
    """Call every reward on the first round's rows (empty completions: the run has generated nothing yet)
    before anything is written; the first that fails stops the run (RewardError)."""
    batch = first_round(rows, plan)
    prompts, completions, kwargs = reward_call(batch)
    for reward in rewards:
        out = reward(prompts, completions, **kwargs)
        if inspect.isawaitable(out):
            out = asyncio.run(_awaited(out))
        if any(v is not None and not math.isfinite(v) for v in out):
            bad = next(v for v in out if v is not None and not math.isfinite(v))
            raise RewardError(
                f"{reward.key}: {reward.label} returned {bad} on the first batch, not a finite number",
                key=reward.key,
                fix="return finite floats (None for a completion it does not score)",
            )


async def _awaited(out: Any) -> Any:
    return await out
