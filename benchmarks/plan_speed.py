"""How fast `gpuplan plan` and `gpuplan compare` answer, side by side with `python -c "import torch"`.

Each command runs as a fresh process (what a user waits for), alternating, N times;
the median wall time is reported. Writes its section of benchmarks/RESULTS.md.

    python benchmarks/plan_speed.py [--runs 7]
    python benchmarks/plan_speed.py --quick   # CI: one run of each command, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "gpuplan plan specs/llama-8b-a100.toml": [sys.executable, "-m", "gpuplan.cli", "plan", "specs/llama-8b-a100.toml"],
    "gpuplan plan specs/tiny.toml": [sys.executable, "-m", "gpuplan.cli", "plan", "specs/tiny.toml"],
    # does not fit: the refusal plans the hardware that would (plan/fit/hardware_alternatives.py)
    "gpuplan plan specs/llama-8b-a100.toml --gpu RTX-4090 (no fit: alternatives)": [
        sys.executable,
        "-m",
        "gpuplan.cli",
        "plan",
        "specs/llama-8b-a100.toml",
        "--gpu",
        "RTX-4090",
    ],
    "gpuplan compare specs/llama-8b-a100.toml (whole catalog x 1,2,4,8)": [
        sys.executable,
        "-m",
        "gpuplan.cli",
        "compare",
        "specs/llama-8b-a100.toml",
    ],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    'python -c "import transformers"': [sys.executable, "-c", "import transformers"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="CI: one run of each command, RESULTS.md left alone")
    args = ap.parse_args()
    if args.quick:
        args.runs = 1
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for _ in range(args.runs):
        for name, cmd in COMMANDS.items():  # alternate so load drifts hit every command alike
            t = time.perf_counter()
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True)
            if r.returncode not in (0, 1) or b"Traceback" in r.stderr:  # 1: the no-fit refusal
                raise SystemExit(f"{name}: exit {r.returncode}\n{r.stderr.decode()[-2000:]}")
            times[name].append(time.perf_counter() - t)
    torch = statistics.median(times['python -c "import torch"'])
    rows = ["| command | median wall (s) | min (s) | max (s) | median / import torch |", "|---|---|---|---|---|"]
    for name, ts in times.items():
        rows.append(f"| `{name}` | {statistics.median(ts):.3f} | {min(ts):.3f} | {max(ts):.3f} | {statistics.median(ts) / torch:.2f}x |")
    body = (
        f"Fresh process each run, {args.runs} runs alternating, on this machine "
        f"(Python {sys.version.split()[0]}; 2 CPU cores shared with other jobs, load average "
        f"{os.getloadavg()[0]:.1f} at the end). Targets: plan of the 8B spec at most 0.2x `import torch`; "
        "compare over the whole catalog (96 plans) under 3 s.\n\n" + "\n".join(rows)
    )
    print(body)
    if not args.quick:
        write_section("plan_speed", "Plan speed", body)


if __name__ == "__main__":
    main()
