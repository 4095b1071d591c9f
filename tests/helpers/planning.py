"""Helpers for plan tests: plan a TOML text written to a real file."""

from __future__ import annotations

from pathlib import Path

from gpuplan.plan.build import plan_file

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "specs"
MODELS = SPECS / "models"

# A fixed environment so plans do not depend on what this machine has installed.
ENV = {"packages": {"torch": "2.13.0", "transformers": "5.24.0", "bitsandbytes": "0.50.2"}, "cuda": "12.8", "cpu_count": 16}
ENV_NO_BNB = {**ENV, "packages": {"torch": "2.13.0", "transformers": "5.24.0", "bitsandbytes": None}}


def write_spec(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    p = tmp_path / name
    p.write_text(text.replace("@MODELS@", str(MODELS)))
    return p


def plan_text(tmp_path: Path, text: str, *, strict: bool = False, env=ENV, detect=None, overrides=None):
    return plan_file(write_spec(tmp_path, text), environment=env, strict=strict, detect=detect, overrides=overrides)


def spec(model: str = "llama-160m", gpu: str = "A100-80GB", training: str = "", data: str = "seq_len = 512", extra: str = "") -> str:
    """A spec text with the common parts filled in."""
    return f"""
[model]
config = "@MODELS@/{model}.json"
{extra}
[hardware]
gpu = "{gpu}"
[data]
{data}
[training]
{training}
"""
