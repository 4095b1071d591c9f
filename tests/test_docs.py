"""The docs document every spec key, the commands and the modules; the CHANGELOG follows Keep a Changelog."""

from pathlib import Path

from gpuplan.spec.schema import SECTIONS

ROOT = Path(__file__).resolve().parent.parent


def test_spec_reference_lists_every_key():
    page = (ROOT / "docs" / "spec-reference.md").read_text()
    for section, cls in SECTIONS.items():
        table = page.split(f"**[{section}]**", 1)[1].split("**[", 1)[0]
        for name in cls.model_fields:
            assert f"| `{name}` |" in table, f"{section}.{name} missing from docs/spec-reference.md's [{section}] table"


def test_readme_has_setup_and_test_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = readme.split("\n## Test\n", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0].strip()
    assert command.startswith("python -m pytest -q -n 2"), command  # the suite is sized for two workers on 2 cores
    assert command in ci.splitlines(), f"CI does not run the README's test command {command!r}"
    assert "pip install torch==2.13.0" in readme and "torch==2.13.0" in ci
    assert '```bash\npython -m pytest -q -n 2 -m "not slow"\n```' in readme, "the README names the inner-loop command"


def test_changelog_has_unreleased_section():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and "Keep a Changelog" in text


def test_module_map_matches_the_tree():
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page.split("## Module map", 1)[1].split("```", 2)[1]
    listed = [line.split()[0] for line in block.splitlines() if line.startswith("gpuplan/")]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "gpuplan").rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    tree |= {str(p.parent.relative_to(ROOT)) + "/" for p in (ROOT / "gpuplan").rglob("__init__.py")}
    assert set(listed) == tree, (sorted(tree - set(listed)), sorted(set(listed) - tree))
