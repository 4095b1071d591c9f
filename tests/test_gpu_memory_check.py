"""benchmarks/gpu_memory_check.py runs to a clean exit where there is no GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_memory_check.py"


def test_gpu_check_exits_cleanly_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would measure for real")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "no CUDA device" in out.stdout
