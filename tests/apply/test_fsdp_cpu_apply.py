"""FSDP2 for real on two CPU ranks over gloo, through `gpuplan apply` (torchrun, Trainer, accelerate's
FSDP plugin: the path GPU runs take), against a one-process run of the same seed.

The tiny Llama's packed 32-token blocks all carry the same number of tokens, so the mean loss of
the 8 sequences of a step does not depend on how the ranks split them: FSDP full_shard,
shard_grad_op and one process must log the same loss per step up to float summation order.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import cli_runs
from tests.helpers.apply_plans import CORPUS, REPO, read_jsonl

MODEL = str(REPO / "specs" / "models" / "tiny-llama-cpu.json")
LOSS_TOL = 2e-3  # absolute, on a loss of ~5.5; measured agreement is ~1e-6


def spec(path, out, *, count=2, strategy="fsdp", sharding="full_shard", max_steps=4, save_steps=1000):
    distributed = f'strategy = "{strategy}"\n' + (f'fsdp_sharding = "{sharding}"\n' if strategy == "fsdp" else "")
    path.write_text(f"""
[model]
config = "{MODEL}"
from_scratch = true
task = "causal-lm"

[hardware]
gpu = "cpu"
count = {count}

[data]
train_files = ["{CORPUS}"]
seq_len = 32

[training]
effective_batch_size = 8
per_device_train_batch_size = 2
max_steps = {max_steps}
lr_scheduler_type = "constant"
learning_rate = 3e-3
logging_steps = 1
save_steps = {save_steps}
seed = 0

[distributed]
{distributed}
[output]
dir = "{out}"
""")
    return path


def gpuplan(*args):
    return cli_runs.gpuplan(*args, timeout=300)


def results(out):
    return json.loads((out / "gpuplan-state.json").read_text())


def losses(out):
    return {m["step"]: m["loss"] for m in read_jsonl(out / "metrics.jsonl") if m["event"] == "train"}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process, the same seed and effective batch (2 per device x 4 accumulation)."""
    tmp = tmp_path_factory.mktemp("one")
    r = gpuplan("apply", spec(tmp / "one.toml", tmp / "run", count=1, strategy="none"), "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert results(tmp / "run")["results"]["engine"] == "none"
    return losses(tmp / "run")


@pytest.mark.slow
def test_fsdp_full_shard_on_two_cpu_ranks_matches_one_process(tmp_path, one_process):
    out = tmp_path / "run"
    r = gpuplan("apply", spec(tmp_path / "fsdp.toml", out), "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "--nproc_per_node=2" in r.stdout and "under FSDP full_shard" in r.stdout
    state = results(out)
    res = state["results"]
    # measured from the wrapped module: fully_shard units that reshard after forward (not a DDP fallback)
    assert res["engine"] == "fsdp2 full_shard" and res["world_size"] == 2
    assert res["global_step"] == 4 and res["samples_seen"] == 4 * 8
    # the tokens every rank consumed, all-gathered by the Trainer: 4 steps x 8 sequences x 32 tokens
    assert res["input_tokens_seen"] == 4 * 8 * 32
    fsdp = losses(out)
    assert sorted(fsdp) == [1, 2, 3, 4]
    assert fsdp == pytest.approx(one_process, abs=LOSS_TOL)
    assert fsdp[4] < fsdp[1]  # it learned
    assert (out / "final" / "model.safetensors").stat().st_size > 3_000_000  # the full 0.8M-parameter model, gathered


@pytest.mark.slow
def test_fsdp_shard_grad_op_checkpoints_and_resumes(tmp_path, one_process):
    out = tmp_path / "run"
    path = spec(tmp_path / "sgo.toml", out, sharding="shard_grad_op", max_steps=2, save_steps=2)
    r = gpuplan("apply", path, "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert results(out)["results"]["engine"] == "fsdp2 shard_grad_op"
    ckpt = out / "checkpoint-2"
    # accelerate's FSDP checkpoint (save_fsdp_model / save_fsdp_optimizer), beside the gathered safetensors
    assert {"pytorch_model_fsdp.bin", "optimizer.bin", "model.safetensors"} <= {p.name for p in ckpt.iterdir()}

    path.write_text(path.read_text().replace("max_steps = 2", "max_steps = 4"))
    r = gpuplan("apply", path, "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"resuming the completed run from {ckpt}" in r.stdout
    res = results(out)["results"]
    assert res["start_step"] == 2 and res["global_step"] == 4 and res["engine"] == "fsdp2 shard_grad_op"
    # weights, Adam states and data position restored: steps 3-4 are the uninterrupted run's
    assert losses(out) == pytest.approx(one_process, abs=LOSS_TOL)


def test_fsdp_on_cpu_is_planned_and_deepspeed_and_offload_are_refused(tmp_path):
    path = spec(tmp_path / "f.toml", tmp_path / "run")
    r = gpuplan("plan", path, "--json")
    assert r.returncode == 0, r.stderr
    settings = json.loads(r.stdout)["settings"]
    assert settings["distributed.strategy"]["value"] == "fsdp"
    assert settings["distributed.fsdp_sharding"]["value"] == "full_shard"
    ds = spec(tmp_path / "ds.toml", tmp_path / "run", strategy="deepspeed")
    r = gpuplan("plan", ds)
    assert r.returncode == 1 and 'distributed.strategy = "deepspeed" on hardware "cpu"' in r.stdout + r.stderr
    off = tmp_path / "off.toml"
    off.write_text(path.read_text().replace('fsdp_sharding = "full_shard"', 'fsdp_sharding = "full_shard"\nfsdp_cpu_offload = true'))
    r = gpuplan("plan", off)
    assert r.returncode == 1 and "distributed.fsdp_cpu_offload = true on hardware" in r.stdout + r.stderr


def test_engine_of_an_unwrapped_model_is_none():
    import torch

    from gpuplan.apply.train.engine import engine_of

    assert engine_of(torch.nn.Linear(2, 2)) == "none"
