"""Regenerate the docs' example output blocks from the real commands.

Each example block, in README.md or a page of docs/, sits between `<!-- example: NAME -->`
and `<!-- /example -->`; this script runs the command that NAME stands for from the
repository root and writes its real output in the block. Paths under the checkout are
shown relative to it (the commands print absolute paths), the home directory as `~` and the
interpreter's path as `python`; the runs record their calibration in a fresh store of this
script's own (so a plan sees no earlier run, and the user's store is left alone), shown as
the default store `~/.cache/gpuplan/calibration.jsonl`; nothing else is edited.

    python benchmarks/readme_examples.py            # rewrite the docs (trains the tiny run first)
    python benchmarks/readme_examples.py --no-apply # only the examples that train nothing
    python benchmarks/readme_examples.py --check    # exit 1 if a doc would change
    python benchmarks/readme_examples.py --quick    # CI: two plan examples (QUICK), in memory; writes nothing

tests/test_readme_examples.py fails when the line formats the docs show no longer
match what the commands print (numbers such as tokens/s are machine-dependent and are
not compared).
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
STORE: Path | None = None  # the calibration store of main()'s runs (the tests' runs keep their own)
# Where the example commands run: a sandbox (a copy of specs/ whose /tmp/gpuplan-runs output dirs point
# inside it, see sandbox()), main()'s own or a test's, so that neither writes into the checkout (init's
# runs/llama-4090.toml, the chat example's runs/tiny-chat/.cache, the tiny apply's runs/tiny) or the
# shared temp dir (the two-node apply's launch plan); what they print is shown as the checkout's.
WORKDIR: Path = REPO
SHIPPED_RUNS = "/tmp/gpuplan-runs/"  # the output dirs the shipped specs name


def doc_files() -> list[Path]:
    """Where example blocks live: the README and every page of docs/."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


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
            ("Throughput:", 3),  # with the assumption: the padded length the time is priced at
            ("Note: dpo:", 1),
        ),
    ),
    "grpo-7b": Example(
        ("plan", "specs/qwen2.5-7b-grpo-vllm.toml"),
        prompt=True,
        select=excerpt(
            ("  + rl.loss_type", 4),  # and rl.generation_batch_size
            ("  + rl.vllm_gpu_memory_utilization", 2),
            ("  + rl.reference", 2),
            ("Memory per GPU", 11),
            ("Throughput:", 4),  # with the generation line: prefill, decode, weight sync
        ),
    ),
    "compare-grpo": Example(
        ("compare", "specs/qwen2.5-7b-grpo-vllm.toml", "--gpus", "H100-80GB,A100-80GB,L40S", "--counts", "1,2"), prompt=True
    ),
    "cluster-plan": Example(("plan", "specs/llama-8b-2nodes-slurm.toml"), select=from_line("Job (slurm)")),
    "chat-data": Example(("data", "specs/tiny-chat.toml", "--examples", "1"), prompt=True),
    "qlora-70b": Example(
        ("plan", "specs/llama-70b-qlora-2x4090.toml"),
        prompt=True,
        select=excerpt(("Memory per GPU", "  host RAM per node"), ("Plan:", 1)),
    ),
    "vlm-qlora-24gb": Example(
        ("plan", "specs/qwen2.5-vl-7b-qlora-24gb.toml"),
        prompt=True,
        select=excerpt(
            ("  ~ lora.target_modules", 2),
            ("  + vision.images_per_example", 2),
            ("Memory per GPU", "  allocated peak"),
            ("  note: vision tower", 1),
            ("Throughput:", 1),
            ("  vision tower:", 1),
            ("Note: images", 2),
            ("Plan:", 1),
        ),
    ),
}


# --quick: a plan that fits and one that does not; neither writes a file (init writes its spec under runs/)
QUICK = ("a100-plan", "mistral-24gb")


def run(args: tuple[str, ...], fails: bool = False) -> str:
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    if STORE is not None:
        env["GPUPLAN_CALIBRATION_FILE"] = str(STORE)
    r = subprocess.run(
        [sys.executable, "-m", "gpuplan", *args],
        cwd=WORKDIR,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=1800,
    )
    if r.returncode != (1 if fails else 0):
        raise SystemExit(f"gpuplan {' '.join(args)} exited {r.returncode}:\n{r.stderr}")
    return r.stdout + r.stderr if fails else r.stdout


def relative_to_checkout(text: str) -> str:
    """Paths under the checkout relative to it; this interpreter's path as `python`; the store as the
    default one; the prices file this process reads (GPUPLAN_PRICES_FILE, XDG_CONFIG_HOME: the tests'
    own) as the reader's default."""
    from gpuplan.hardware.userfiles import prices_path

    if STORE is not None:
        text = text.replace(str(STORE), "~/.cache/gpuplan/calibration.jsonl")
    text = text.replace(str(prices_path()), "~/.config/gpuplan/prices.toml")
    if WORKDIR != REPO:
        text = text.replace(f"{WORKDIR}/gpuplan-runs/", SHIPPED_RUNS).replace(f"{WORKDIR}/", "")
    return text.replace(f"{sys.executable} ", "python ").replace(f"{REPO}/", "").replace(f"{Path.home()}/", "~/")


def sandbox(tmp: Path) -> Path:
    """A copy of specs/ under `tmp` whose shipped output dirs are under `tmp` too; run the examples there
    (WORKDIR = the returned folder) and they print what they print in the checkout."""
    shutil.copytree(REPO / "specs", tmp / "specs")
    (tmp / "runs").mkdir()
    for spec in (tmp / "specs").glob("*.toml"):
        spec.write_text(spec.read_text(encoding="utf-8").replace(SHIPPED_RUNS, f"{tmp}/gpuplan-runs/"), encoding="utf-8")
    return tmp


def example_lines(name: str) -> list[str]:
    ex = EXAMPLES[name]
    out = run(ex.args, ex.fails)
    if ex.file:
        out = (WORKDIR / ex.file).read_text(encoding="utf-8")
    lines = ex.select(relative_to_checkout(out))
    return ([f"$ gpuplan {' '.join(ex.args)}"] if ex.prompt else []) + lines


def regenerate(text: str, made: dict[str, list[str]], where: str = "README.md") -> str:
    """`text` with the blocks named in `made` rewritten to those lines."""

    def block(m: re.Match) -> str:
        name = m.group("name")
        if name not in EXAMPLES:
            raise SystemExit(f"{where}: unknown example {name!r}; known: {', '.join(EXAMPLES)}")
        if name not in made:
            return m.group(0)
        indent = m.group("indent")
        body = "\n".join((indent + line).rstrip() for line in made[name])
        return m.group(1) + body + m.group(6)

    return BLOCK.sub(block, text)


def blocks(text: str) -> dict[str, list[str]]:
    """A document's example blocks: name -> lines, indentation removed."""
    out = {}
    for m in BLOCK.finditer(text):
        indent = len(m.group("indent"))
        out[m.group("name")] = [line[indent:] for line in m.group("body").splitlines()]
    return out


def all_blocks() -> dict[str, tuple[Path, list[str]]]:
    """Every example block of the docs: name -> (the file it is in, its lines); a name used twice is an error."""
    found: dict[str, tuple[Path, list[str]]] = {}
    for path in doc_files():
        for name, lines in blocks(path.read_text(encoding="utf-8")).items():
            if name in found:
                raise SystemExit(f"example {name!r} is in both {found[name][0].relative_to(REPO)} and {path.relative_to(REPO)}")
            found[name] = (path, lines)
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-apply", action="store_true", help="leave the examples that train as they are")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a doc would change")
    p.add_argument("--quick", action="store_true", help=f"CI: regenerate {' and '.join(QUICK)} in memory; write nothing, exit 0")
    args = p.parse_args()
    global STORE, WORKDIR
    tmp = Path(tempfile.mkdtemp(prefix="gpuplan-examples-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    STORE = tmp / "calibration.jsonl"
    WORKDIR = sandbox(tmp / "work")
    shown = all_blocks()
    # In EXAMPLES' order, not the documents': an example that used a trained run would come after it.
    wanted = set(QUICK) if args.quick else {n for n, ex in EXAMPLES.items() if not (args.no_apply and ex.trains)}
    made = {n: example_lines(n) for n in EXAMPLES if n in shown and n in wanted}
    changed = []
    for path in doc_files():
        where = str(path.relative_to(REPO))
        old = path.read_text(encoding="utf-8")
        new = regenerate(old, made, where)
        if new != old:
            changed.append(where)
            if not (args.check or args.quick):
                path.write_text(new, encoding="utf-8")
    if args.quick:
        print(
            f"{', '.join(sorted(made))} regenerated in memory" + (f" (would change: {', '.join(changed)})" if changed else " (no change)")
        )
        return 0
    if args.check:
        print(f"would change: {', '.join(changed)}" if changed else "the docs are up to date")
        return int(bool(changed))
    print(f"{', '.join(sorted(made))} regenerated; changed: {', '.join(changed) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
