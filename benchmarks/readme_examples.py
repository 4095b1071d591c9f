"""Regenerate the README's example output blocks from the real commands.

Each example block in README.md sits between `<!-- example: NAME -->` and
`<!-- /example -->`; this script runs the command that NAME stands for from the
repository root and writes its real output in the block. Paths under the checkout are
shown relative to it (the commands print absolute paths), the home directory as `~` and the
interpreter's path as `python`; nothing else is edited.

    python benchmarks/readme_examples.py            # rewrite README.md (runs the tiny apply: ~1 min)
    python benchmarks/readme_examples.py --no-apply # only the plan examples (seconds)
    python benchmarks/readme_examples.py --check    # exit 1 if README.md would change
    python benchmarks/readme_examples.py --quick    # CI: two plan examples (QUICK), in memory; writes nothing

tests/test_readme_examples.py fails when the line formats the README shows no longer
match what the commands print (numbers such as tokens/s are machine-dependent and are
not compared).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
BLOCK = re.compile(
    r"(<!-- example: (?P<name>[\w-]+) -->\n(?P<indent> *)```(?P<lang>\w*)\n)(?P<body>.*?)(\n(?P=indent)```\n<!-- /example -->)", re.S
)


def tail_of_apply(out: str) -> list[str]:
    """The end of `gpuplan apply`: the first, a middle and the last step line, then the summary."""
    lines = out.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    picked = [steps[0], steps[len(steps) // 2], steps[-1]] if len(steps) >= 3 else steps
    summary_at = next(i for i, line in enumerate(lines) if line.startswith("peak memory: "))
    return picked + lines[summary_at:]


def from_line(prefix: str) -> Callable[[str], list[str]]:
    """The output from the first line that starts with `prefix` on."""

    def select(out: str) -> list[str]:
        lines = out.rstrip("\n").splitlines()
        return lines[next(i for i, line in enumerate(lines) if line.startswith(prefix)) :]

    return select


def excerpt(*groups: tuple[str, int | str], lead: bool = True) -> Callable[[str], list[str]]:
    """Parts of the output, "..." between them (and first, with `lead`): each group is the line
    that starts with its prefix and the next lines up to a count, or up to the first line that
    starts with an end prefix, included."""

    def select(out: str) -> list[str]:
        lines = out.rstrip("\n").splitlines()
        picked: list[str] = []
        for n, (prefix, end) in enumerate(groups):
            i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
            stop = i + end if isinstance(end, int) else next(j for j in range(i, len(lines)) if lines[j].startswith(end)) + 1
            picked += (["..."] if n or lead else []) + lines[i:stop]
        return picked

    return select


@dataclass(frozen=True)
class Example:
    args: tuple[str, ...]  # gpuplan's arguments
    select: Callable[[str], list[str]] = lambda out: out.rstrip("\n").splitlines()
    prompt: bool = False  # show "$ gpuplan ..." as the first line
    trains: bool = False  # runs a training (skipped by --no-apply)
    fails: bool = False  # exits 1 on purpose (a plan that does not fit): its error output is the example
    file: str | None = None  # show this file, which the command writes, instead of what it prints


INIT_4090 = (
    "init",
    "specs/models/llama-3.1-8b.json",
    "--gpu",
    "RTX-4090",
    "--data",
    "specs/data/chat.jsonl",
    "--out",
    "runs/llama-4090.toml",
    "--force",
)

EXAMPLES: dict[str, Example] = {
    "init-4090": Example(INIT_4090, prompt=True),
    "init-4090-spec": Example(
        INIT_4090,
        file="runs/llama-4090.toml",
        select=excerpt(
            ("# Chosen by the plan", "method ="),
            ("# Read from the rows", "format ="),
            ("# Turned on by the plan", "gradient_checkpointing ="),
            lead=False,
        ),
    ),
    "tiny-apply": Example(("apply", "specs/tiny.toml", "--yes", "--restart"), select=tail_of_apply, trains=True),
    "a100-plan": Example(("plan", "specs/a100-fp16.toml"), prompt=True),
    "two-nodes": Example(("apply", "specs/llama-8b-2nodes.toml"), select=from_line("This plan runs")),
    "compare-8b": Example(("compare", "specs/llama-8b-a100.toml"), prompt=True),
    "rtx4090-8b": Example(("plan", "specs/llama-8b-a100.toml", "--gpu", "RTX-4090"), prompt=True, fails=True),
    "qlora-4090": Example(("plan", "specs/llama-8b-qlora-4090.toml"), prompt=True),
    "mistral-24gb": Example(("plan", "specs/mistral-7b-24gb.toml"), prompt=True, fails=True),
    "dpo-8b": Example(
        ("plan", "specs/llama-8b-lora-dpo.toml"),
        prompt=True,
        select=excerpt(
            ("  + data.packing", 2),
            ("  + preference.max_length", 6),
            ("Memory per GPU", 10),
            ("Throughput:", 2),
            ("Note: dpo:", 1),
        ),
    ),
    "chat-data": Example(("data", "specs/tiny-chat.toml", "--examples", "1"), prompt=True),
}


# --quick: a plan that fits and one that does not; neither writes a file (init writes its spec under runs/)
QUICK = ("a100-plan", "mistral-24gb")


def run(args: tuple[str, ...], fails: bool = False) -> str:
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "gpuplan", *args], cwd=REPO, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800
    )
    if r.returncode != (1 if fails else 0):
        raise SystemExit(f"gpuplan {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
    return r.stdout + r.stderr if fails else r.stdout


def relative_to_checkout(text: str) -> str:
    """Paths under the checkout relative to it; this interpreter's path as `python`."""
    return text.replace(f"{sys.executable} ", "python ").replace(f"{REPO}/", "").replace(f"{Path.home()}/", "~/")


def example_lines(name: str) -> list[str]:
    ex = EXAMPLES[name]
    out = run(ex.args, ex.fails)
    if ex.file:
        out = (REPO / ex.file).read_text(encoding="utf-8")
    lines = ex.select(relative_to_checkout(out))
    return ([f"$ gpuplan {' '.join(ex.args)}"] if ex.prompt else []) + lines


def regenerate(text: str, names: set[str]) -> str:
    def block(m: re.Match) -> str:
        name = m.group("name")
        if name not in EXAMPLES:
            raise SystemExit(f"README.md: unknown example {name!r}; known: {', '.join(EXAMPLES)}")
        if name not in names:
            return m.group(0)
        indent = m.group("indent")
        body = "\n".join((indent + line).rstrip() for line in example_lines(name))
        return m.group(1) + body + m.group(6)

    return BLOCK.sub(block, text)


def blocks(text: str) -> dict[str, list[str]]:
    """The README's example blocks: name -> lines, indentation removed."""
    out = {}
    for m in BLOCK.finditer(text):
        indent = len(m.group("indent"))
        out[m.group("name")] = [line[indent:] for line in m.group("body").splitlines()]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-apply", action="store_true", help="leave the examples that train as they are")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if README.md would change")
    p.add_argument("--quick", action="store_true", help=f"CI: regenerate {' and '.join(QUICK)} in memory; write nothing, exit 0")
    args = p.parse_args()
    names = set(QUICK) if args.quick else {n for n, ex in EXAMPLES.items() if not (args.no_apply and ex.trains)}
    old = README.read_text(encoding="utf-8")
    new = regenerate(old, names)
    if args.quick:
        print(f"README.md: {', '.join(sorted(names))} regenerated in memory" + (" (would change)" if new != old else " (no change)"))
        return 0
    if args.check:
        print("README.md is up to date" if new == old else "README.md would change")
        return int(new != old)
    if new != old:
        README.write_text(new, encoding="utf-8")
    print(f"README.md: {', '.join(sorted(names))} regenerated" + ("" if new != old else " (no change)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
