"""dict -> Spec, translating every Pydantic error into one Diagnostic.

All problems of a spec are reported together; each names the key path, the bad
value, what is allowed and, for unknown keys, the closest known key.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.spec.names import OPTIMIZER_NAMES, REMOVED_OPTIMIZERS
from gpuplan.spec.schema import SECTIONS, Spec
from gpuplan.toml_value import toml_value


def validate_spec(raw: Mapping[str, Any]) -> Spec:
    """Validate a parsed spec; raise GpuplanError listing every problem."""
    diags: list[Diagnostic] = []
    spec = None
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as e:
        diags.extend(_translate(e, raw))
    training = raw.get("training") if isinstance(raw, Mapping) else None
    if isinstance(training, Mapping):
        diags.extend(_check_optim(training.get("optim")))
    if diags:
        raise GpuplanError(diags)
    assert spec is not None
    return spec


def _check_optim(optim: Any) -> list[Diagnostic]:
    if not isinstance(optim, str) or optim == "auto" or optim in OPTIMIZER_NAMES or optim in REMOVED_OPTIMIZERS:
        return []
    close = difflib.get_close_matches(optim, OPTIMIZER_NAMES, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}?" if close else "see transformers OptimizerNames"
    return [
        Diagnostic(
            "error",
            "training.optim",
            f"training.optim = {_show(optim)}: not an optimizer transformers knows; {hint}",
            detail="allowed: auto, " + ", ".join(OPTIMIZER_NAMES),
            fix=f'set training.optim = "{close[0]}"' if close else 'set training.optim = "auto"',
        )
    ]


def _show(value: Any) -> str:
    """A value as it would be written in TOML, shortened."""
    if isinstance(value, (bool, str, int, float)):
        text = toml_value(value)
    elif isinstance(value, Mapping):
        text = "a table"
    elif isinstance(value, list):
        text = f"a list of {len(value)}"
    else:
        text = type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _clean_loc(loc: tuple) -> tuple[tuple, type[BaseModel] | None, bool]:
    """Drop Pydantic's union tags from a location.

    Returns (path, model class holding the last key, whether the full loc was a key path).
    """
    model: type[BaseModel] | None = Spec
    path: list = []
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path.append(part)
            continue
        if model is not None and part in model.model_fields:
            path.append(part)
            holder = model
            model = SECTIONS.get(part) if holder is Spec else _table_model(holder, part)
            continue
        if i == len(loc) - 1 and model is not None:  # an unknown key at the end
            path.append(part)
            return tuple(path), model, True
        return tuple(path), None, False
    return tuple(path), None, True


def _table_model(holder: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model of a key holding tables ([[rl.rewards]]: list[RewardSpec]), so keys inside them get did-you-mean."""
    ann = holder.model_fields[name].annotation
    for arg in (*get_args(ann), ann):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(path: tuple) -> str:
    """A key path as TOML writes it: training.optim, data.train_files[0], "my key".x."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
            continue
        part = p if _BARE_KEY.fullmatch(p) else toml_value(p)
        out += f".{part}" if out else part
    return out


def _lookup(raw: Any, path: tuple) -> Any:
    for p in path:
        try:
            raw = raw[p]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


# Unknown keys reported one by one per table; the rest are counted in one diagnostic
# (a generated spec with 100,000 stray keys must not take a minute and flood the terminal).
MAX_UNKNOWN_PER_TABLE = 20


def _translate(err: ValidationError, raw: Mapping[str, Any]) -> list[Diagnostic]:
    grouped: dict[tuple, list[Any]] = {}
    unknown: list[Diagnostic] = []
    extra: dict[tuple, list] = {}  # table path -> its unknown keys
    for e in err.errors(include_url=False):
        path, holder, _ = _clean_loc(tuple(e["loc"]))
        if e["type"] == "extra_forbidden":
            seen = extra.setdefault(path[:-1], [])
            seen.append(path[-1])
            if len(seen) <= MAX_UNKNOWN_PER_TABLE:
                unknown.append(_unknown_key(path, holder))
        else:
            grouped.setdefault(path, []).append(e)
    out = list(unknown)
    for table, keys in extra.items():
        if len(keys) > MAX_UNKNOWN_PER_TABLE:
            rest = keys[MAX_UNKNOWN_PER_TABLE:]
            where = f"[{_dotted(table)}]" if table else "the top level"
            shown = ", ".join(_dotted((k,)) for k in rest[:5]) + (", ..." if len(rest) > 5 else "")
            out.append(
                Diagnostic(
                    "error",
                    _dotted(table + (rest[0],)),
                    f"{len(rest)} more unknown keys in {where} ({shown})",
                    fix="remove the keys the schema does not have (`gpuplan schema` lists them)",
                )
            )
    for path, errs in grouped.items():
        out.append(_bad_value(path, errs, raw))
    return out


def _unknown_key(path: tuple, holder: type[BaseModel] | None) -> Diagnostic:
    key = _dotted(path)
    name = str(path[-1])
    if len(path) == 1:
        known = list(SECTIONS)
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean [{close[0]}]?" if close else "sections are " + ", ".join(f"[{s}]" for s in known)
        return Diagnostic(
            "error", key, f"[{key}]: unknown section; {hint}", fix=f"rename [{key}] to [{close[0]}]" if close else f"remove [{key}]"
        )
    fields = list(holder.model_fields) if holder else []
    close = suggest_key(name, fields)
    parent = _dotted(path[:-1])
    if close:
        also = f" (or {close[1]})" if len(close) > 1 else ""
        return Diagnostic(
            "error",
            key,
            f"{key}: unknown key; did you mean {close[0]}{also}?",
            fix=f"rename {key} to {parent}.{close[0]}",
        )
    elsewhere = [s for s, cls in SECTIONS.items() if name in cls.model_fields]
    if elsewhere:
        return Diagnostic(
            "error",
            key,
            f"{key}: unknown key in [{parent}]; {name} belongs in [{elsewhere[0]}]",
            fix=f"move it to [{elsewhere[0]}]",
        )
    return Diagnostic(
        "error",
        key,
        f"{key}: unknown key",
        detail=f"keys of [{parent}]: " + ", ".join(fields),
        fix=f"remove {key}",
    )


def suggest_key(name: str, fields: list[str]) -> list[str]:
    """Closest known keys, best first.

    A key that holds every word of the typo wins over a closer spelling
    (per_device_batch_size -> per_device_train_batch_size, not ..._eval_...);
    ties keep the schema's order, which lists the common key first.
    """
    words = set(name.lower().split("_"))
    supersets = [f for f in fields if words < set(f.split("_"))]
    if supersets:
        return supersets[:2]
    return difflib.get_close_matches(name.lower(), fields, n=1, cutoff=0.6)


_PHRASES = (
    ("greater than or equal to ", ">= "),
    ("less than or equal to ", "<= "),
    ("greater than ", "> "),
    ("less than ", "< "),
    ("a valid integer", "an integer"),
    ("a valid boolean", "true or false"),
    ("a valid string", "a string"),
    ("a valid number", "a number"),
    ("a valid list", "a list"),
    ("'auto'", '"auto"'),
    ("String should have ", "a string of "),
    ("List should have ", "a list of "),
    (" after validation", ""),
)


def _plain(msg: str) -> str:
    text = msg.removeprefix("Input should be ").removeprefix("Value error, ")
    for a, b in _PHRASES:
        text = text.replace(a, b)
    return text


def _bad_value(path: tuple, errs: list[dict], raw: Mapping[str, Any]) -> Diagnostic:
    key = _dotted(path) or "(spec)"
    first = errs[0]
    if first["type"] == "missing":
        if len(path) == 1:
            return Diagnostic("error", key, f"[{key}] is missing", fix=f"add a [{key}] table (see docs/spec-reference.md)")
        return Diagnostic("error", key, f"{key} is missing", fix=f"set {key}")
    value = first.get("input", _lookup(raw, path))
    if first["type"] == "value_error":
        msg = first["msg"].removeprefix("Value error, ")
        return Diagnostic("error", key, f"{key}: {msg}", fix=msg)
    if first["type"] in ("model_type", "model_attributes_type") or (len(path) == 1 and not isinstance(value, Mapping)):
        return Diagnostic("error", key, f"[{key}] must be a table, not {_show(value)}", fix=f"write [{key}] as a table of keys")
    allowed: list[str] = []
    for e in errs:
        text = _plain(e["msg"])
        if text not in allowed:
            allowed.append(text)
    expected = " or ".join(allowed)
    return Diagnostic("error", key, f"{key} = {_show(value)}: should be {expected}", fix=f"set {key} to a value that is {expected}")
