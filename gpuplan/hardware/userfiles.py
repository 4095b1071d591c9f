"""Files gpuplan keeps for the user, outside any project: prices and measured runs.

Locations follow the XDG base directory spec (what platformdirs returns on Linux),
without the dependency: the config dir holds what the user writes (prices.toml), the
cache dir what gpuplan learns (calibration.jsonl, one measured run per line, safe to
delete). GPUPLAN_PRICES_FILE and GPUPLAN_CALIBRATION_FILE override each path (tests,
CI, a shared team file). Imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuplan.errors import OneProblem

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PRICES_ENV = "GPUPLAN_PRICES_FILE"
CALIBRATION_ENV = "GPUPLAN_CALIBRATION_FILE"


class UserFileError(OneProblem, ValueError):
    """A user file is malformed: the message names the file, the key, the value and the fix."""


def _xdg(var: str, fallback: str) -> Path:
    base = os.environ.get(var)
    return Path(base) if base and os.path.isabs(base) else Path.home() / fallback  # the spec: ignore relative


def shown_path(path: Path) -> str:
    """A user file's path as a footer shows it: the home directory as ~."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def prices_path() -> Path:
    return Path(os.environ.get(PRICES_ENV) or _xdg("XDG_CONFIG_HOME", ".config") / "gpuplan" / "prices.toml")


def calibration_path() -> Path:
    return Path(os.environ.get(CALIBRATION_ENV) or _xdg("XDG_CACHE_HOME", ".cache") / "gpuplan" / "calibration.jsonl")


def read_user_prices(path: Path | None = None) -> dict[str, tuple[float, str]]:
    """Catalog name -> (USD per GPU-hour, source) from the user's prices.toml; {} when absent.

    Format: one line per GPU under [prices], names as `gpuplan gpus` prints them or any
    alias:  [prices]  "A100-80GB" = 1.59   H100 = 2.49
    """
    from gpuplan.hardware.catalog import AmbiguousGPUError, UnknownGPUError, lookup

    path = path or prices_path()
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UserFileError(f"{path}: cannot read the prices file ({e}); fix or delete it") from None
    table = data.get("prices")
    if not isinstance(table, dict):
        raise UserFileError(f'{path}: no [prices] table; write e.g. [prices] then "A100-80GB" = 1.59')
    out: dict[str, tuple[float, str]] = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 10_000:
            raise UserFileError(f"{path}: prices.{name} = {value!r} is not a price; write a positive number of USD per GPU-hour, e.g. 1.59")
        try:
            canonical = lookup(name).name
        except (UnknownGPUError, AmbiguousGPUError) as e:
            raise UserFileError(f"{path}: prices.{name}: {e}") from None
        out[canonical] = (float(value), f"your prices file {path}")
    return out


def read_calibrations(path: Path | None = None) -> list[dict[str, Any]]:
    """Every measured run in the calibration store, oldest first; unreadable lines are skipped."""
    path = path or calibration_path()
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise UserFileError(f"{path}: cannot read the calibration store ({e.strerror or e}); delete it or set {CALIBRATION_ENV}") from None
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: the others still count
        if isinstance(rec, dict) and isinstance(rec.get("utilisation"), (int, float)) and rec.get("gpu"):
            records.append(rec)
    return records


def append_calibration(record: dict[str, Any], path: Path | None = None) -> Path:
    """Add one measured run to the store (one line, appended: concurrent runs do not clobber)."""
    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def clear_calibrations(path: Path | None = None) -> int:
    """Delete the store; the number of records it held."""
    path = path or calibration_path()
    n = len(read_calibrations(path))
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    return n
