"""A user reward function ("file.py:function" in [[rl.rewards]]), checked at plan time without running it.

The plan never imports user code: the file is parsed with `ast` and the function's signature read from
its `def`. What it must accept is how TRL 1.16 calls a custom reward (trl/trainer/grpo_trainer.py
`_calculate_rewards`, the same in rloo_trainer.py):

    reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs)

where reward_kwargs holds every dataset column but "prompt" / "completion" / "completion_ids" (a list per
column, one value per completion) and `trainer_state`, `log_extra`, `log_metric`. Everything is passed by
keyword, so:
- a positional-only parameter (before `/`) cannot be filled: an error;
- without `**kwargs` every keyword TRL passes must be a parameter, or Python raises TypeError on the first
  batch; the columns vary with the data, so the plan asks for `**kwargs`;
- a required parameter (no default) that is not one of TRL's names must be a dataset column; one the rows
  lack is an error naming the column.
A reward may be a `def` or an `async def` (TRL awaits coroutine functions). Anything else bound to the name
(a lambda, functools.partial, a class) is not checked here: the plan refuses it rather than guess.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

# the keywords TRL 1.16 passes to every custom reward besides the dataset's columns (_calculate_rewards)
TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
# columns TRL keeps out of reward_kwargs (_calculate_rewards: keys not in ["prompt", "completion", "completion_ids"])
NOT_PASSED = ("prompt", "completion", "completion_ids")


@dataclass(frozen=True)
class RewardSignature:
    """What the plan read from a reward function's `def`."""

    name: str
    line: int
    is_async: bool
    required: tuple[str, ...]  # parameters without a default (keyword-fillable)
    accepts_kwargs: bool


@dataclass(frozen=True)
class RewardProblem:
    summary: str
    fix: str


def read_signature(path: str, name: str) -> RewardSignature | RewardProblem:
    """The signature of top-level function `name` in the Python file `path`, or the problem."""
    shown = os.path.basename(path)
    if not os.path.isfile(path):
        return RewardProblem(f"{path} does not exist", "write the reward file beside the spec, or fix the path (relative to the spec)")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, UnicodeDecodeError) as e:
        return RewardProblem(f"{path} cannot be read ({e})", "make the reward file a readable UTF-8 Python file")
    except SyntaxError as e:
        return RewardProblem(f"{shown} is not valid Python: {e.msg} at line {e.lineno}", f"fix the syntax error in {path}")
    found: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    other: ast.stmt | None = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            found = node
        elif _binds(node, name):
            other = node
    if found is None:
        defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        if other is not None:
            return RewardProblem(
                f"{name} in {shown} (line {other.lineno}) is not a top-level `def`: the plan reads a reward's signature from its def "
                "and does not run the file",
                f"define the reward as `def {name}(prompts, completions, **kwargs):` at the top level of {shown}",
            )
        import difflib

        close = difflib.get_close_matches(name, defs, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else (f" (it defines {', '.join(defs[:5])})" if defs else " (it defines no function)")
        return RewardProblem(
            f"{shown} has no top-level function {name}{hint}",
            f'set function = "{os.path.basename(path)}:{close[0]}"'
            if close
            else f"define `def {name}(prompts, completions, **kwargs):` in {shown}",
        )
    a = found.args
    if a.posonlyargs:
        return RewardProblem(
            f"{name} ({shown}, line {found.lineno}) has positional-only parameters ({', '.join(p.arg for p in a.posonlyargs)}): "
            "TRL passes every argument by keyword",
            f"remove the `/` from {name}'s parameters",
        )
    positional = a.args
    n_defaults = len(a.defaults)
    required = [p.arg for p in positional[: len(positional) - n_defaults]]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is None]
    return RewardSignature(name, found.lineno, isinstance(found, ast.AsyncFunctionDef), tuple(required), a.kwarg is not None)


def _binds(node: ast.stmt, name: str) -> bool:
    """A top-level statement that binds `name` otherwise than by def (assignment, class, import)."""
    if isinstance(node, ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any((al.asname or al.name.split(".")[0]) == name for al in node.names)
    return False


def signature_problems(sig: RewardSignature, shown: str, columns: tuple[str, ...] | None) -> list[RewardProblem]:
    """What TRL's call would break on. `columns`: the rows' columns where the plan read them, else None."""
    out: list[RewardProblem] = []
    where = f"{sig.name} ({shown}, line {sig.line})"
    if not sig.accepts_kwargs:
        out.append(
            RewardProblem(
                f"{where} takes no **kwargs: TRL 1.16 calls a reward with prompts, completions, completion_ids, trainer_state, "
                "log_extra, log_metric and every dataset column as keywords (trl/trainer/grpo_trainer.py _calculate_rewards)",
                f"add **kwargs to {sig.name}'s parameters: def {sig.name}({', '.join((*sig.required, '**kwargs'))})",
            )
        )
    passed = set(TRL_KEYWORDS) | ({c for c in columns if c not in NOT_PASSED} if columns is not None else set())
    for p in sig.required:
        if p in passed or (columns is None and p not in NOT_PASSED):
            continue
        if p in NOT_PASSED:
            out.append(
                RewardProblem(
                    f"{where} requires {p!r}, which TRL never passes to a reward (it passes prompts and completions, plural)",
                    f"rename the parameter to {p}s" if p in ("prompt", "completion") else f"give {p} a default or remove it",
                )
            )
            continue
        out.append(
            RewardProblem(
                f"{where} requires {p!r}: TRL passes it only as a dataset column, and the rows have no {p!r} column"
                + (f" (they have {', '.join(columns)})" if columns else ""),
                f"add a {p!r} field to every row, or give {p} a default",
            )
        )
    return out
