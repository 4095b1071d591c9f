"""compare's precision column says what the run computes in: bf16 weights on a V100 / T4 are emulated bf16,
and the plan's "emulated, slow" warning is carried into the row and the table."""

from __future__ import annotations

import json
from pathlib import Path

from gpuplan.cli.main import main
from gpuplan.plan.compare import compare
from gpuplan.plan.inputs.environment import local_environment
from gpuplan.spec.load import load_toml

LLAMA_8B = Path(__file__).resolve().parents[2] / "specs" / "llama-8b-a100.toml"  # model.dtype = "bfloat16"


def test_bf16_weights_on_gpus_without_bf16_are_emulated_bf16_with_the_warning():
    rows = compare(load_toml(LLAMA_8B), gpus=["V100-32GB", "T4", "A100-80GB"], counts=[8], environment=local_environment())
    by = {r["gpu"]: r for r in rows}
    for gpu in ("V100-32GB", "T4"):
        r = by[gpu]
        assert r["fits"] and r["weight_dtype"] == "bfloat16"
        assert r["precision"] == "bf16 (emulated)"
        assert any("no native bf16: emulated, slow" in w for w in r["warnings"])
    assert by["A100-80GB"]["precision"] == "bf16"
    assert not any("emulated" in w for w in by["A100-80GB"]["warnings"])


def test_compare_table_prints_the_emulated_warning(capsys):
    assert main(["compare", str(LLAMA_8B), "--gpus", "V100-32GB", "--counts", "8"]) == 0
    out = capsys.readouterr().out
    assert "bf16 (emulated)" in out and " fp32 " not in out
    assert 'warning (8 x V100-32GB): model.dtype = "bfloat16" on V100-32GB, which has no native bf16: emulated, slow' in out
    assert main(["compare", str(LLAMA_8B), "--gpus", "V100-32GB", "--counts", "8", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    assert row["precision"] == "bf16 (emulated)" and row["warnings"]
