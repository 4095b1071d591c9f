"""A Hub id with no Hub to reach: one quick failure, said once, naming HF_HUB_OFFLINE=1 and `hf download`.

The Hub is made unreachable deterministically and without any network: HF_ENDPOINT points at a
port of 127.0.0.1 that nothing listens on (connection refused at once). huggingface_hub 2.4 would
retry an uncached file 5 times, 1+2+4+8+8 s (file_download.py "No local file found. Retrying..").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.hub_cache import REPO, add_repo, chat_rows, tiny_model_files

# The CLI starts in about 1-2 s here (more on a loaded machine); the library's retries alone take 23 s.
QUICK_S = 12.0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on leaving: nothing listens there


def run_unreachable(args, tmp_path, cache) -> tuple[subprocess.CompletedProcess, float]:
    env = {
        **os.environ,
        "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(tmp_path / "hf-home"),
        "PYTHONPATH": str(REPO),
        "NO_COLOR": "1",
    }
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN"):
        env.pop(k, None)
    t = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "gpuplan", *map(str, args)], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    return r, time.monotonic() - t


def _one_clear_error(r: subprocess.CompletedProcess, seconds: float, command: str) -> None:
    err = r.stderr
    assert r.returncode == 1, err
    assert seconds < QUICK_S, f"{seconds:.1f} s: {err}"
    assert "Retrying" not in err and "thrown while requesting" not in err, err  # no library retry noise
    assert [line.startswith("Error:") for line in err.splitlines()].count(True) == 1 and "cannot be reached" in err, err
    assert err.count(command) == 1, err  # the fetch command once, in the fix
    assert "HF_HUB_OFFLINE=1" in err, err
    assert "Traceback" not in err and "internal error" not in err, err


def test_init_of_an_uncached_hub_model_fails_at_once(tmp_path):
    r, seconds = run_unreachable(["init", "acme/absent", "--gpu", "cpu", "--out", tmp_path / "x.toml"], tmp_path, tmp_path / "cache")
    _one_clear_error(r, seconds, "hf download acme/absent config.json --revision main")
    assert "model 'acme/absent' at revision 'main'" in r.stderr
    assert not (tmp_path / "x.toml").exists()


def test_init_checks_a_local_data_file_before_the_model(tmp_path):
    r, seconds = run_unreachable(
        ["init", "acme/absent", "--data", "my-chat.jsonl", "--gpu", "cpu", "--out", tmp_path / "x.toml"], tmp_path, tmp_path / "cache"
    )
    assert r.returncode == 1 and seconds < QUICK_S, (seconds, r.stderr)
    assert "my-chat.jsonl" in r.stderr and "no such file" in r.stderr, r.stderr
    assert "acme/absent" not in r.stderr and "cannot be reached" not in r.stderr, r.stderr  # the Hub was not asked


@pytest.fixture
def cached_model_only(tmp_path):
    cache = tmp_path / "cache"
    add_repo(cache, "acme/micro-llama", tiny_model_files(tmp_path))
    spec = tmp_path / "hub.toml"
    spec.write_text(
        '[model]\nname_or_path = "acme/micro-llama"\n\n[hardware]\ngpu = "cpu"\n\n'
        '[data]\ndataset = "acme/chat"\nformat = "chat"\nchat_template = "chatml"\nseq_len = 128\n\n'
        f'[training]\neffective_batch_size = 4\nmax_steps = 2\n\n[output]\ndir = "{tmp_path / "run"}"\n'
    )
    assert chat_rows()  # (the dataset is left out of the cache on purpose)
    return spec, cache


def test_plan_with_a_cached_model_and_an_uncached_dataset_fails_once_on_the_dataset(cached_model_only, tmp_path):
    spec, cache = cached_model_only
    r, seconds = run_unreachable(["plan", spec], tmp_path, cache)
    _one_clear_error(r, seconds, "hf download acme/chat --revision main --repo-type dataset")
    assert "data.dataset: dataset 'acme/chat'" in r.stderr, r.stderr
