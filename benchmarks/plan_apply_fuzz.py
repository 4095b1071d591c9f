"""Randomized plan -> apply (issue 30), the long profile: N generated specs, each refused at plan time or
applied for one step on CPU with the audit (gpuplan/apply/train/audit.py) passing; counts go to RESULTS.md.

    python benchmarks/plan_apply_fuzz.py --cases 40 [--seed 0] [--json out.json]
    python benchmarks/plan_apply_fuzz.py --quick   # CI: 2 cases, RESULTS.md left alone

The cases are tests/helpers/plan_apply.py's draws over objective x method x savers x data format x
precision; tests/apply/test_plan_apply_fuzz.py runs a few of them in CI. A "failed" case is a plan
that succeeded and an apply that did not: each is listed with the issue-30 defect it is expected
from, or as new. Exit 1 when a failure has no known defect.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write every outcome here")
    ap.add_argument("--no-record", action="store_true", help="do not write RESULTS.md")
    ap.add_argument("--quick", action="store_true", help="CI: 2 cases, RESULTS.md left alone")
    args = ap.parse_args()
    if args.quick:
        args.cases, args.no_record = 2, True
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import tests.conftest  # noqa: F401  (the fixed CPU probe every test plan reads)
    from tests.helpers import plan_apply

    outcomes = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpuplan-plan-apply-") as tmp:
        base = plan_apply.random_base(Path(tmp))
        for i, case in enumerate(plan_apply.cases(args.cases, args.seed)):
            t = time.perf_counter()
            o = plan_apply.run(case, Path(tmp) / f"case{i}", base)
            outcomes.append(o)
            print(f"{i:4d} {time.perf_counter() - t:6.1f}s {o.result:8s} {case.label} {o.known_defect or ''} {o.detail[:160]}", flush=True)
    wall = time.perf_counter() - start
    counts = collections.Counter(o.result for o in outcomes)
    failed = [o for o in outcomes if o.result == "failed"]
    by_cause = collections.Counter(_cause(o.known_defect) if o.known_defect else "unknown: " + _first_line(o.detail) for o in failed)
    if args.json:
        Path(args.json).write_text(json.dumps([o.to_dict() for o in outcomes], indent=1))
    rows = ["| outcome | cases |", "|---|---:|"] + [f"| {k} | {counts.get(k, 0)} |" for k in ("refused", "applied", "failed")]
    causes = ["| failure | cases |", "|---|---:|"] + [f"| {k} | {n} |" for k, n in by_cause.most_common()]
    checks = sum(o.checks for o in outcomes)
    command = f"python benchmarks/plan_apply_fuzz.py --cases {args.cases} --seed {args.seed}"
    body = (
        f"`{command}`, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs (shared), **{len(outcomes)} cases in {wall:.0f} s**. Refused = a PlanError naming the key; "
        f"applied = one optimizer step with both audit stages passing ({checks} checks in all); failed = the plan "
        "succeeded and apply did not.\n\n" + "\n".join(rows) + ("\n\n" + "\n".join(causes) if failed else "")
    )
    if not args.no_record:
        write_section(
            "plan_apply_fuzz",
            "Randomized plan -> apply",
            body,
            command=command,
        )
    print(body)
    return 1 if any(o.known_defect is None for o in failed) else 0


def _cause(cause: int | str) -> str:
    return f"issue 30 defect {cause}" if isinstance(cause, int) else cause


def _first_line(detail: str) -> str:
    line = detail.splitlines()[0] if detail else "?"
    return line.replace("|", "/")[:140]


if __name__ == "__main__":
    sys.exit(main())
