"""The README's example blocks show what the commands print today (issue 15, item 7).

benchmarks/readme_examples.py regenerates the blocks; these tests fail when the line
formats a block shows drift from the real output. Numbers (tokens/s, GiB, worker counts)
depend on the machine and are compared as a placeholder, everything else literally.
"""

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.helpers.cli_runs import REPO, command, env, run

_spec = importlib.util.spec_from_file_location("readme_examples", REPO / "benchmarks" / "readme_examples.py")
readme_examples = importlib.util.module_from_spec(_spec)
sys.modules["readme_examples"] = readme_examples  # dataclasses look their module up
_spec.loader.exec_module(readme_examples)

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def shape(line: str) -> str:
    return NUMBER.sub("N", line.rstrip())


def readme_block(name: str) -> list[str]:
    return readme_examples.blocks((REPO / "README.md").read_text(encoding="utf-8"))[name]


def test_every_example_block_is_one_the_script_knows():
    names = set(readme_examples.blocks((REPO / "README.md").read_text(encoding="utf-8")))
    assert names == set(readme_examples.EXAMPLES)


@pytest.mark.parametrize("name", [n for n, ex in readme_examples.EXAMPLES.items() if not ex.trains])
def test_plan_examples_match_the_command_line_for_line(name):
    shown, now = readme_block(name), readme_examples.example_lines(name)
    assert [shape(x) for x in shown] == [shape(x) for x in now], (
        f"README example {name!r} drifted: run python benchmarks/readme_examples.py --no-apply"
    )


@pytest.mark.slow
def test_the_tiny_apply_example_has_the_lines_apply_prints(tmp_path):
    """The tiny spec, 4 steps instead of 200 (same formats), its output dir in tmp_path."""
    text = (REPO / "specs" / "tiny.toml").read_text()
    text = (
        text.replace('"models/', f'"{REPO}/specs/models/')
        .replace('"data/', f'"{REPO}/specs/data/')
        .replace("max_steps = 200", "max_steps = 4")
        .replace("eval_steps = 100", "eval_steps = 2")
        .replace("logging_steps = 10", "logging_steps = 1")
        .replace('dir = "../runs/tiny"', f'dir = "{tmp_path / "out"}"')
    )
    spec = tmp_path / "tiny.toml"
    spec.write_text(text)
    r = run(command("apply", spec, "--yes"), capture_output=True, text=True, env=env(), stdin=subprocess.DEVNULL, timeout=900)
    assert r.returncode == 0, r.stderr
    now = readme_examples.tail_of_apply(r.stdout.replace(str(tmp_path / "out"), "runs/tiny"))
    store = re.compile(r"\(recorded in [^)]*\)")  # the calibration store: the user's, or this test's own

    def same(lines):
        return [store.sub("(recorded in STORE)", shape(x)) for x in lines]

    assert same(readme_block("tiny-apply")) == same(now), "README's tiny-apply example drifted: run python benchmarks/readme_examples.py"
