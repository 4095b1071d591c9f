"""A Hugging Face cache built in a test, in huggingface_hub's own layout, and the CLI run against it.

    <cache>/models--org--name/refs/main            the commit sha, as text
    <cache>/models--org--name/snapshots/<sha>/...  symlinks into blobs/
    <cache>/models--org--name/blobs/<sha256>       file contents (LFS blobs are named by sha256)

(huggingface_hub file_download.py, "Cache layout"; datasets use datasets--org--name.)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.apply_plans import MICRO_LLAMA
from tests.helpers.cli_runs import BOOT, run
from tests.helpers.cli_runs import env as cli_env

REPO = Path(__file__).resolve().parents[2]


def add_repo(cache: Path, repo_id: str, files: dict[str, bytes], *, repo_type: str = "model", ref: str = "main") -> str:
    """Put `files` in the cache as one commit of `repo_id`, point refs/<ref> at it, return the commit."""
    folder = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + hashlib.sha256(files[name]).digest())
    commit = digest.hexdigest()
    for name, content in files.items():
        blob = folder / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    return commit


def tiny_model_files(tmp_path: Path, seed: int = 0) -> dict[str, bytes]:
    """A micro Llama built and saved here (safetensors + config + byte-level tokenizer files)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    cfg = dict(MICRO_LLAMA)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    out = tmp_path / f"saved-{seed}"
    model.save_pretrained(out)
    byte_level_tokenizer().save_pretrained(out)
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


def chat_rows(n: int = 24) -> bytes:
    rows = [
        {"messages": [{"role": "user", "content": f"Add {i} and 1."}, {"role": "assistant", "content": f"{i} + 1 = {i + 1}."}]}
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def worker_cache() -> Path:
    """This test worker's own Hugging Face hub cache: where huggingface_hub looks in the worker's environment,
    $XDG_CACHE_HOME/huggingface/hub (huggingface_hub constants: HF_HOME defaults to $XDG_CACHE_HOME/huggingface),
    XDG_CACHE_HOME being the session's (tests/conftest.py). Its commands need no HF_HUB_CACHE of their own, so
    the worker's fork server serves them (huggingface_hub reads HF_HUB_CACHE at import: a cache of a test's own
    is an import-time environment of its own, a fresh process or a server of its own, 10-15 s of imports each).

    The cache outlives the test: a test names its repos by ids no other test of the worker uses for other
    files, or re-adds them before it reads them (add_repo writes the files and points refs/<ref> at them)."""
    assert "HF_HUB_CACHE" not in os.environ and "HF_HOME" not in os.environ, "the worker's own cache is the default one"
    return Path(os.environ["XDG_CACHE_HOME"]) / "huggingface" / "hub"


def run_cli(
    args: list[str], cache: Path, *, offline: bool = True, timeout: int = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`python -m gpuplan ARGS` against `cache`; `cwd`: the command's folder (default: the cache's parent; a spec
    without [output] trains into runs/<name> under it)."""
    if cache == worker_cache():
        assert cwd is not None, "a command on the worker's cache runs in the test's own folder: pass cwd=tmp_path"
        env = cli_env()  # the worker's own environment: its fork server serves torch and torch-free commands alike
    else:
        env = {
            **os.environ,
            "HF_HUB_CACHE": str(cache),
            "HF_HOME": str(cache.parent / "hf-home"),
            "PYTHONPATH": f"{REPO}{os.pathsep}{BOOT}",
            "NO_COLOR": "1",
        }
    env.pop("HF_TOKEN", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env.pop("HF_HUB_OFFLINE", None)
    # A command that imports torch (apply, data) in a cache of its own is forked from a fork server of that
    # environment (tests/helpers/forked.py: the second torch command there starts one); the others run fresh.
    folder = cwd or cache.parent
    return run([sys.executable, "-m", "gpuplan", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=folder)
