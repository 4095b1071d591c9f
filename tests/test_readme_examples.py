"""The docs' example blocks show what the commands print today (issue 15, item 7).

benchmarks/readme_examples.py regenerates the blocks, in README.md and in docs/*.md; these
tests fail when the line formats a block shows drift from the real output. Numbers
(tokens/s, GiB, worker counts) depend on the machine and are compared as a placeholder,
everything else literally.
"""

import importlib.util
import re
import sys

import pytest

from tests.helpers.cli_runs import REPO, gpuplan

_spec = importlib.util.spec_from_file_location("readme_examples", REPO / "benchmarks" / "readme_examples.py")
readme_examples = importlib.util.module_from_spec(_spec)
sys.modules["readme_examples"] = readme_examples  # dataclasses look their module up
_spec.loader.exec_module(readme_examples)

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
STORE = re.compile(r"\(recorded in [^)]*\)")  # the calibration store: the user's, or a test's own


def shape(line: str) -> str:
    return STORE.sub("(recorded in STORE)", NUMBER.sub("N", line.rstrip()))


def comparable(name: str, lines: list[str]) -> list[str]:
    return [shape(x) for x in lines]


def shown(name: str) -> list[str]:
    return readme_examples.all_blocks()[name][1]


def test_every_example_block_is_one_the_script_knows_and_each_is_shown_once():
    found = readme_examples.all_blocks()  # raises on a name shown in two places
    assert set(found) == set(readme_examples.EXAMPLES)
    assert {p.relative_to(REPO).parts[0] for p, _ in found.values()} <= {"README.md", "docs"}


def test_examples_are_found_in_docs_pages_too(tmp_path, monkeypatch):
    """A block on a docs/ page counts, and a name shown twice is refused."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("<!-- example: a100-plan -->\n```text\nx\n```\n<!-- /example -->\n")
    (tmp_path / "README.md").write_text("<!-- example: a100-plan -->\n```text\ny\n```\n<!-- /example -->\n")
    monkeypatch.setattr(readme_examples, "REPO", tmp_path)
    monkeypatch.setattr(readme_examples, "README", tmp_path / "README.md")
    with pytest.raises(SystemExit, match="a100-plan.*README.md and docs/page.md"):
        readme_examples.all_blocks()
    (tmp_path / "README.md").write_text("no examples\n")
    assert readme_examples.all_blocks() == {"a100-plan": (page, ["x"])}


@pytest.mark.parametrize("name", [n for n, ex in readme_examples.EXAMPLES.items() if not ex.trains])
def test_plan_examples_match_the_command_line_for_line(name, tmp_path, monkeypatch):
    monkeypatch.setattr(readme_examples, "WORKDIR", readme_examples.sandbox(tmp_path))  # writes stay in tmp_path
    now = readme_examples.example_lines(name)
    assert comparable(name, shown(name)) == comparable(name, now), (
        f"example {name!r} drifted: run python benchmarks/readme_examples.py --no-apply"
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
    r = gpuplan("apply", spec, "--yes", timeout=900)
    assert r.returncode == 0, r.stderr
    now = readme_examples.tail_of_apply(r.stdout.replace(str(tmp_path / "out"), "runs/tiny"))
    assert comparable("tiny-apply", shown("tiny-apply")) == comparable("tiny-apply", now), (
        "the tiny-apply example drifted: run python benchmarks/readme_examples.py"
    )
