"""docs/clusters.md shows the real job each engine renders from one shipped multi-node spec
(specs/llama-8b-2nodes-slurm.toml): every `<!-- rendered: TARGET -->` block is what that engine's
`render` writes for the plan, file by file. The spec's [launch] is Slurm's; another target renders the
same plan with the [launch] keys of DOC_LAUNCH. After a change to a renderer, rewrite the blocks with
`python -m tests.clusters.test_clusters_docs` (the `cluster-plan` example block is
benchmarks/readme_examples.py's).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuplan.clusters.engine import ENGINES, engine_for
from gpuplan.clusters.job import job_for
from gpuplan.plan.build import plan_file
from gpuplan.plan.resolved import LaunchSettings
from tests.helpers.cluster_launches import ENGINE_LAUNCH
from tests.helpers.planning import ENV, SPECS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "clusters.md"
SPEC = SPECS / "llama-8b-2nodes-slurm.toml"
BLOCK = re.compile(r"<!-- rendered: (?P<target>\w+) -->\n(?P<body>.*?)<!-- /rendered -->", re.S)
LANGUAGES = {".sbatch": "bash", ".sh": "bash", ".yaml": "yaml", ".yml": "yaml", ".py": "python", ".json": "json"}


def _slurm(launch: LaunchSettings) -> LaunchSettings:
    return launch  # the spec's own [launch]


def _engine(target: str) -> Callable[[LaunchSettings], LaunchSettings]:
    """The spec's [launch] with Slurm's keys dropped and `target`'s own (tests/helpers/cluster_launches.py)."""
    return lambda launch: dataclasses.replace(launch, partition=None, account=None, qos=None, **ENGINE_LAUNCH[target])


# target -> the [launch] the docs render the shipped plan with (the other engines' keys: cluster-render's)
DOC_LAUNCH: dict[str, Callable[[LaunchSettings], LaunchSettings]] = {"slurm": _slurm, **{t: _engine(t) for t in ENGINE_LAUNCH}}


def built_targets() -> list[str]:
    """The targets whose engine module exists in this tree."""
    return [t for t, module in ENGINES.items() if importlib.util.find_spec(module) is not None]


def rendered_markdown(files: dict[str, str]) -> str:
    """What a rendered block holds: each file's name, then its text in a fenced block."""
    parts = []
    for name, text in files.items():
        lang = LANGUAGES.get(Path(name).suffix, "text")
        parts.append(f"`{name}`:\n\n```{lang}\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def expected(target: str) -> str:
    plan = plan_file(SPEC, environment=ENV)
    launch = DOC_LAUNCH[target](dataclasses.replace(plan.resolved.launch, target=target))  # type: ignore[arg-type]
    return rendered_markdown(engine_for(target).render(job_for(plan, launch, environment=ENV, prices={}, calibrations=[])))


def page_blocks() -> dict[str, str]:
    return {m.group("target"): m.group("body") for m in BLOCK.finditer(PAGE.read_text(encoding="utf-8"))}


def test_every_built_engine_has_its_rendered_job_on_the_page():
    blocks = page_blocks()
    assert set(built_targets()) <= set(blocks), f"docs/clusters.md lacks a rendered block for {set(built_targets()) - set(blocks)}"
    assert set(blocks) <= set(ENGINES)


@pytest.mark.parametrize("target", built_targets())
def test_the_page_shows_what_the_engine_renders(target):
    assert page_blocks()[target] == expected(target), "rewrite it: python -m tests.clusters.test_clusters_docs"


def write() -> None:
    text = PAGE.read_text(encoding="utf-8")
    built = set(built_targets())

    def block(m: re.Match) -> str:
        target = m.group("target")
        body = expected(target) if target in built else m.group("body")
        return f"<!-- rendered: {target} -->\n{body}<!-- /rendered -->"

    PAGE.write_text(BLOCK.sub(block, text), encoding="utf-8")


if __name__ == "__main__":
    write()
    sys.exit(0)
