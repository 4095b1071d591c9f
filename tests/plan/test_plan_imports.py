"""docs/design.md principle 3: `gpuplan plan` on a known architecture imports neither torch nor transformers."""

import subprocess
import sys

from tests.helpers.planning import SPECS

PROBE = """
import sys
from gpuplan.cli import main
rc = main(["plan", sys.argv[1], "--json"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "bitsandbytes", "datasets", "accelerate"))
print("HEAVY:", heavy, file=sys.stderr)
sys.exit(rc if not heavy else 99)
"""


def test_plan_imports_neither_torch_nor_transformers():
    for spec in ("llama-8b-a100.toml", "tiny.toml", "bert-large-v100.toml"):
        r = subprocess.run([sys.executable, "-c", PROBE, str(SPECS / spec)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "HEAVY: []" in r.stderr
