"""Run the spec fuzzer's long profile and record its example counts and time in RESULTS.md.

    python benchmarks/fuzz.py            # GPUPLAN_FUZZ_PROFILE=long, about 20,000 examples
    python benchmarks/fuzz.py --profile ci
    python benchmarks/fuzz.py --quick         # CI: the "quick" profile (a few examples per test), writes nothing

CI runs tests/plan/test_fuzz_specs.py with the bounded "ci" profile; this script is the
documented longer run. It fails (exit 1) when pytest fails, after recording the result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TESTS = {
    "valid": "valid specs (schema keys and values x shipped model configs x catalog GPUs)",
    "near_valid": "near-valid: 1-3 keys set to wrong types / out of range / NaN / inf, misspelled, moved, unknown sections",
    "damaged_text": "valid TOML text cut, or with a character inserted or deleted, or a line repeated",
    "model_config": "a shipped config.json with 1-3 fields set to hostile values",
    "unicode": "random unicode keys and nested values",
    "deep": "nesting 1-3000 deep: arrays, inline tables, dotted keys, table headers",
    "small": "empty, whitespace, BOM, comment-only and tiny files",
    "bytes": "random bytes",
    "paths": "hostile paths in model.config / name_or_path / output.dir / train_files, --gpu overrides, "
    "a directory or absurd name as the spec",
    "huge": "files of up to 1,000 KiB (a comment, a string, a list of up to 256k items, up to 64k keys) and one over the 1 MiB limit",
    "cli": "the real `gpuplan plan` command (subprocess)",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="long", choices=("ci", "long", "quick"))
    ap.add_argument("--quick", action="store_true", help="CI: --profile quick, RESULTS.md left alone")
    args = ap.parse_args()
    if args.quick:
        args.profile = "quick"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "counts.json"
        env = {**os.environ, "GPUPLAN_FUZZ_PROFILE": args.profile, "GPUPLAN_FUZZ_REPORT": str(report), "HF_HUB_OFFLINE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/plan/test_fuzz_specs.py"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        counts = json.loads(report.read_text()) if report.exists() else {}
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"
    rows = ["| test | examples | accepted | rejected | what |", "|---|---:|---:|---:|---|"]
    for name, what in TESTS.items():
        ok = counts.get(f"{name}:accepted", counts.get(f"{name}:exit0", 0))
        bad = counts.get(f"{name}:rejected", counts.get(f"{name}:exit1", 0))
        rows.append(f"| {name} | {counts.get(name, 0)} | {ok} | {bad} | {what} |")
    total = sum(counts.get(n, 0) for n in TESTS)
    body = (
        f"Profile `{args.profile}` (`GPUPLAN_FUZZ_PROFILE={args.profile} python -m pytest tests/plan/test_fuzz_specs.py`), "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs (shared).\n\n"
        f"**{total} examples in {wall:.0f} s**; pytest: `{tail}`. Rejected = a PlanError whose every error names a "
        "key path or the file (with line:col for TOML syntax); accepted = a plan whose invariants held. "
        'For `cli`, accepted/rejected are exit codes 0/1; a traceback or "internal error" fails.\n\n' + "\n".join(rows)
    )
    if not args.quick:
        write_section("fuzz", "Fuzzing", body)
    print(body)
    if proc.returncode:
        print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n", file=sys.stderr)
    return 1 if proc.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
