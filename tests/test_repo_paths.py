"""Every repository path the code's comments and the docs cite exists, and every internal link resolves.

Scanned: the comments and docstrings of gpuplan/, tests/ and benchmarks/ (not string values,
which are data), and the docs (README.md, docs/*.md, benchmarks/*.md). CHANGELOG.md and
docs/history.md are history and may name paths that have since moved; docs/reference/ holds
other projects' material, which names their files.

A path is checked when it starts at the repository root (`gpuplan/plan/build.py`,
`docs/design.md`, `specs/tiny.toml`), or when its first folder is a folder of the repository
(`rules/batch.py`, `memory/overhead.py`, `reference/peer-rules.md`): then some file or folder of
the repository must end with it. Paths of other projects (`trl/trainer/dpo_trainer.py`,
`torch/utils/checkpoint.py`), absolute paths, run outputs (`runs/tiny/final`) and a user's or
a Hub repo's `data/` and `models/` are not repository paths; another project's file whose path
starts like one of ours is cited as `owner/repo:path` (`huggingface/peft:docs/source/...`).
A markdown link to a file of the repository must resolve from the page that has it, and its
`#anchor` must be a heading of the target page.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("gpuplan", "tests", "benchmarks", "docs", "specs", ".ci")
SKIP_DIRS = {".git", "__pycache__", "runs", ".venv", ".whl", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}
HISTORY = {"CHANGELOG.md", "docs/history.md"}
# A whole path token: not inside a longer path, a URL or a glob/placeholder.
PATH = re.compile(r"(?<![\w./~:@$<{*-])((?:\.ci|[A-Za-z_][\w.-]*)/[\w./-]*[\w/])(?![\w*{<$(-]|/\w|\.\w)")
EXTENSIONS = (".py", ".md", ".json", ".jsonl", ".toml", ".txt", ".csv", ".tsv", ".yaml", ".yml", ".sh", ".cfg")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@cache
def tree() -> tuple[frozenset[str], frozenset[str]]:
    """The repository's files and folders, as paths relative to its root ("gpuplan/plan/" for a folder)."""
    files, folders = set(), set()
    stack = [ROOT]
    while stack:
        here = stack.pop()
        for p in here.iterdir():
            if p.is_dir():
                if p.name not in SKIP_DIRS and not p.name.endswith(".egg-info"):
                    folders.add(p.relative_to(ROOT).as_posix() + "/")
                    stack.append(p)
            else:
                files.add(p.relative_to(ROOT).as_posix())
    return frozenset(files), frozenset(folders)


@cache
def tails() -> frozenset[str]:
    """Every file's and folder's path without one or more of its leading folders."""
    out = set()
    for p in tree()[0] | tree()[1]:
        parts = p.rstrip("/").split("/")
        out |= {"/".join(parts[i:]) + ("/" if p.endswith("/") else "") for i in range(1, len(parts))}
    return frozenset(out)


GENERIC = {"data", "models"}  # folders every project has: `data/train.jsonl` is a user's file


@cache
def folder_names() -> frozenset[str]:
    return frozenset(f.rstrip("/").rsplit("/", 1)[-1] for f in tree()[1] if f.split("/", 1)[0] in TOP) - GENERIC


def is_repository_path(token: str) -> bool:
    first = token.split("/", 1)[0]
    looks_like_file = token.endswith("/") or token.endswith(EXTENSIONS)
    return looks_like_file and (first in TOP or first in folder_names())


def resolves(token: str, base: Path | None = None) -> bool:
    """`token` names a file or folder of the repository: from the root, from `base`, or as the tail of one."""
    files, folders = tree()
    name = token.rstrip("/") + ("/" if token.endswith("/") else "")
    pool = folders if name.endswith("/") else files
    if name in pool:
        return True
    if base is not None:
        try:
            rel = (base / name).resolve().relative_to(ROOT).as_posix() + ("/" if name.endswith("/") else "")
        except ValueError:
            rel = None
        if rel in pool:
            return True
    if name.split("/", 1)[0] in TOP:  # rooted: it must be exactly there
        return False
    return name in tails()


def cited_paths(text: str) -> list[str]:
    found = []
    for m in PATH.finditer(text):
        token = m.group(1).rstrip(".")
        if is_repository_path(token):
            found.append(token)
    return found


def comments_and_docstrings(source: str) -> str:
    """The comments and docstrings of a Python file: what it says, not the values it holds."""
    parts = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return "\n".join(parts)


def python_files() -> list[Path]:
    return sorted(ROOT / f for f in tree()[0] if f.endswith(".py") and f.split("/", 1)[0] in ("gpuplan", "tests", "benchmarks"))


def doc_files() -> list[Path]:
    names = [f for f in tree()[0] if f.endswith(".md") and f not in HISTORY]
    return sorted(ROOT / f for f in names if f == "README.md" or f.count("/") == 1 and f.split("/", 1)[0] in ("docs", "benchmarks"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_every_path_a_comment_or_docstring_cites_exists():
    missing = []
    for path in python_files():
        for token in cited_paths(comments_and_docstrings(path.read_text(encoding="utf-8"))):
            if not resolves(token, path.parent):
                missing.append(f"{path.relative_to(ROOT)}: {token}")
    assert not missing, "comments cite paths that are not in the repository:\n" + "\n".join(missing)


def test_a_package_docstring_names_only_modules_it_holds():
    """A package's map of its modules (`build.py assembles; rules/ holds them`) names its own files."""
    missing = []
    for init in python_files():
        if init.name != "__init__.py" or not init.relative_to(ROOT).as_posix().startswith("gpuplan/"):
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        held = {f.rsplit("/", 1)[-1] for f in tree()[0] if f.startswith(init.parent.relative_to(ROOT).as_posix() + "/")}
        for name in re.findall(r"(?<![\w./])(\w+\.py)\b", doc):
            if name not in held:
                missing.append(f"{init.relative_to(ROOT)}: {name}")
    assert not missing, "package docstrings name modules they do not hold:\n" + "\n".join(missing)


def test_every_path_a_doc_cites_exists():
    missing = []
    for page in doc_files():
        text = LINK.sub(" ", page.read_text(encoding="utf-8"))  # links are checked below, from the page
        for token in cited_paths(text):
            if not resolves(token, page.parent):
                missing.append(f"{page.relative_to(ROOT)}: {token}")
    assert not missing, "docs cite paths that are not in the repository:\n" + "\n".join(missing)


def test_every_internal_link_and_anchor_resolves():
    broken = []
    for page in doc_files():
        for m in LINK.finditer(page.read_text(encoding="utf-8")):
            target = m.group(1)
            if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    "text, paths",
    [
        ("see gpuplan/plan/build.py.", ["gpuplan/plan/build.py"]),
        ("apply/train/execute.py and memory/overhead.py", ["apply/train/execute.py", "memory/overhead.py"]),
        ("trl/trainer/dpo_trainer.py, torch/utils/checkpoint.py, huggingface/peft:docs/source/x.md", []),  # other projects' files
        ('train_files = ["data/train.jsonl"]', []),  # a user's file
        ("https://github.com/x/gpuplan/docs/a.md, /tmp/gpuplan/docs/x.md, ~/.cache/gpuplan/c.jsonl", []),
        ("tests/apply/test_*.py, gpuplan/apply/<room>/, runs/tiny/final", []),
    ],
)
def test_what_counts_as_a_cited_repository_path(text, paths):
    assert cited_paths(text) == paths


def test_a_moved_path_is_caught_and_a_present_one_is_not():
    assert resolves("gpuplan/plan/") and resolves("docs/design.md") and resolves("rules/batch.py")
    assert not resolves("gpuplan/plan/no_such_module.py") and not resolves("docs/no-such-page.md")
    assert not resolves("rules/no_such_rule.py")


def test_anchors_follow_github_slugs(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Your first run: init, plan, apply\n```\n# not a heading\n```\n## `gpuplan init` writes\n")
    assert anchors(page) == {"your-first-run-init-plan-apply", "gpuplan-init-writes"}
