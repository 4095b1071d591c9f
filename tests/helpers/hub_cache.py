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


def run_cli(args: list[str], cache: Path, *, offline: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
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
    # in the test's own folder: a spec without [output] trains into runs/<name> under the working directory.
    # A command that imports torch (apply, data) is forked from a fork server of this environment (one per
    # cache: huggingface_hub reads HF_HUB_CACHE at import), tests/helpers/forked.py; the others run fresh.
    return run([sys.executable, "-m", "gpuplan", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=cache.parent)
