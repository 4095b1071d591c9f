"""Scale-out apply: a real two-process DDP run through torchrun (gloo, CPU), the torchrun argv
per node, SLURM, the per-node commands, and the multi-process TrainingArguments."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.launch.torchrun import Launch, decide, first_host, launch_command, slurm_context
from gpuplan.apply.train.arguments import training_arguments_kwargs
from tests.helpers import cli_runs
from tests.helpers.apply_plans import CORPUS, H100_PROFILE, REPO, cpu_plan, read_jsonl

PY = sys.executable
WORKER = ["-m", "gpuplan.apply.launch.worker", "/runs/x/gpuplan-launch-plan.json"]
MODEL = str(REPO / "specs" / "models" / "tiny-llama-cpu.json")


def spec(tmp_path, *, count=2, nodes=1, extra=""):
    path = tmp_path / "ddp.toml"
    path.write_text(f"""
[model]
config = "{MODEL}"
from_scratch = true
task = "causal-lm"

[hardware]
gpu = "cpu"
count = {count}
nodes = {nodes}

[data]
train_files = ["{CORPUS}"]
seq_len = 32

[training]
effective_batch_size = 8
per_device_train_batch_size = 2
max_steps = 4
logging_steps = 1
save_steps = 1000
seed = 0

[distributed]
strategy = "ddp"
{extra}

[output]
dir = "{tmp_path / "run"}"
""")
    return path


def gpuplan(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("WORLD_SIZE", "MASTER_ADDR")}
    env = {**env, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    return cli_runs.run([PY, "-m", "gpuplan.cli", *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_two_process_ddp_run_sees_the_effective_batch_per_step(tmp_path):
    """The must-show: `gpuplan apply` starts torchrun, two gloo ranks train the tiny Llama. The true entry
    points: apply, torchrun's agent and both ranks are fresh interpreters here (GPUPLAN_TEST_FORK=0); the
    other multi-rank tests fork them from the test worker's server (tests/helpers/boot/sitecustomize.py)."""
    t0 = time.perf_counter()
    r = gpuplan("apply", spec(tmp_path), "--yes", env_extra={"GPUPLAN_TEST_FORK": "0"})
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "torch.distributed.run --nproc_per_node=2 --standalone --nnodes=1 -m gpuplan.apply.launch.worker" in r.stdout
    assert "batch 8 = 2 x 2 x 2" in r.stdout  # per-device 2 x accumulation 2 x 2 ranks
    state = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())
    res = state["results"]
    assert state["status"] == "completed" and res["world_size"] == 2 and res["device"] == "cpu"
    assert res["engine"] == "ddp"  # read from the wrapped model (apply/train/engine.py)
    assert res["global_step"] == 4 and res["samples_seen"] == 4 * 8 == state["progress"]["samples_seen"]
    # Measured, not computed: the Trainer all-gathers the tokens every rank consumed per micro-batch.
    # 4 steps x (2 per device x 2 micro-batches x 2 ranks = 8 sequences) x 32 tokens.
    assert res["input_tokens_seen"] == 4 * 8 * 32
    train = [m for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if m["event"] == "train"]
    assert [m["step"] for m in train] == [1, 2, 3, 4]  # rank 0 alone writes: one line per step
    assert all(m["samples_seen"] == m["step"] * 8 and m["loss"] > 0 for m in train)
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert elapsed < 120, f"two-process run took {elapsed:.0f} s"


def test_multi_node_without_slurm_prints_each_node_command_and_trains_nothing(tmp_path):
    path = spec(tmp_path, nodes=2, extra='master_addr = "node0"\nmaster_port = 29611')
    r = gpuplan("apply", path, "--yes")
    assert r.returncode == 0, r.stderr
    plan_file = tmp_path / "run" / "gpuplan-launch-plan.json"
    for rank in (0, 1):
        assert f"node {rank}: gpuplan apply {path} --node-rank {rank} --yes" in r.stdout
        assert (
            f"--nproc_per_node=2 --nnodes=2 --node_rank={rank} --master_addr=node0 --master_port=29611 "
            f"-m gpuplan.apply.launch.worker {plan_file}"
        ) in r.stdout
    assert "srun --nodes=2 --ntasks-per-node=1" in r.stdout
    assert plan_file.is_file() and not (tmp_path / "run" / "gpuplan-state.json").exists()


def test_multi_node_without_a_rendezvous_host_is_a_clear_error(tmp_path):
    r = gpuplan("apply", spec(tmp_path, nodes=2), "--yes")
    assert r.returncode == 1 and "distributed.master_addr" in r.stderr and "Traceback" not in r.stderr


def plan_for(tmp_path, *, count=2, nodes=1, addr=None, port=29500, hardware=None, **kw):
    values = {"hardware.count": count, "hardware.nodes": nodes, "distributed.strategy": "ddp"}
    values |= {"distributed.master_addr": addr, "distributed.master_port": port}
    return cpu_plan(tmp_path, hardware=hardware, **{**values, **kw})


def test_launch_command_single_node(tmp_path):
    argv = launch_command(plan_for(tmp_path, count=8, hardware=H100_PROFILE), WORKER[-1], node_rank=0, env={}, python="python")
    assert argv == ["python", "-m", "torch.distributed.run", "--nproc_per_node=8", "--standalone", "--nnodes=1", *WORKER]


def test_launch_command_two_nodes(tmp_path):
    plan = plan_for(tmp_path, count=8, nodes=2, addr="node0", port=29611, hardware=H100_PROFILE)
    for rank in (0, 1):
        argv = launch_command(plan, WORKER[-1], node_rank=rank, env={}, python="python", resume_from="/runs/x/checkpoint-9")
        assert argv == [
            "python",
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=8",
            "--nnodes=2",
            f"--node_rank={rank}",
            "--master_addr=node0",
            "--master_port=29611",
            *WORKER,
            "--resume-from",
            "/runs/x/checkpoint-9",
        ]
    with pytest.raises(ApplyError, match="must be 0..1"):
        launch_command(plan, WORKER[-1], node_rank=2, env={})


def test_under_slurm_the_node_rank_and_host_come_from_slurm(tmp_path):
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "1",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    plan = plan_for(tmp_path, count=4, nodes=2, hardware=H100_PROFILE)
    assert slurm_context(env) == (1, "gpu07")
    assert decide(plan, None, env) == Launch(1, False)
    argv = launch_command(plan, WORKER[-1], node_rank=1, env=env, python="python")
    assert argv == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=4",
        "--nnodes=2",
        "--node_rank=1",
        "--master_addr=gpu07",
        "--master_port=29500",
        *WORKER,
    ]
    assert slurm_context({**env, "MASTER_ADDR": "head"}) == (1, "head")
    with pytest.raises(ApplyError, match="one task per node"):
        slurm_context({**env, "SLURM_NTASKS": "8"})
    with pytest.raises(ApplyError, match="hardware.nodes = 2 but this SLURM job has 3"):
        decide(plan, None, {**env, "SLURM_NNODES": "3", "SLURM_NTASKS": "3"})
    assert slurm_context({"MASTER_ADDR": "x"}) is None


def test_decide(tmp_path):
    assert decide(plan_for(tmp_path, count=1), None, {}) is None  # one process: in-process execute
    assert decide(plan_for(tmp_path), None, {"WORLD_SIZE": "2"}) is None  # already a torchrun rank
    assert decide(plan_for(tmp_path), None, {}) == Launch(0, False)
    two = plan_for(tmp_path, nodes=2, addr="n0", hardware=H100_PROFILE)
    assert decide(two, None, {}) == Launch(0, True)
    assert decide(two, 1, {}) == Launch(1, False)
    with pytest.raises(ApplyError, match="one node"):
        decide(plan_for(tmp_path), 1, {})


@pytest.mark.parametrize(
    "nodelist,host",
    [
        ("gpu[01-04],gpu07", "gpu01"),
        ("gpu07", "gpu07"),
        ("node[3,5-9]", "node3"),
        ("a-b-[009-011]-ib", "a-b-009-ib"),
        ("n1,n2", "n1"),
        ("rack[2]", "rack2"),
    ],
)
def test_first_host_of_a_slurm_nodelist(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("bad", ["", "[", "gpu[a-b]"])
def test_first_host_refuses_what_it_cannot_read(bad):
    with pytest.raises(ApplyError, match="MASTER_ADDR"):
        first_host(bad)


def test_multi_process_cpu_arguments_use_gloo_and_count_tokens(tmp_path):
    kw = training_arguments_kwargs(plan_for(tmp_path))
    assert kw["ddp_backend"] == "gloo" and kw["ddp_find_unused_parameters"] is False
    assert kw["include_num_input_tokens_seen"] == "all"
    single = training_arguments_kwargs(plan_for(tmp_path, count=1))
    assert not {"ddp_backend", "ddp_find_unused_parameters", "include_num_input_tokens_seen"} & set(single)
    gpu = training_arguments_kwargs(plan_for(tmp_path, hardware=H100_PROFILE))
    assert "ddp_backend" not in gpu and gpu["ddp_find_unused_parameters"] is False


def test_fsdp_with_accumulation_syncs_each_micro_batch(tmp_path):
    acc = {"distributed.strategy": "fsdp", "training.gradient_accumulation_steps": 4}
    kw = training_arguments_kwargs(plan_for(tmp_path, hardware=H100_PROFILE, **acc))
    assert kw["accelerator_config"] == {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    assert "use_orig_params" not in kw["fsdp_config"]  # FSDP2 always keeps the original parameters
    one = training_arguments_kwargs(plan_for(tmp_path, hardware=H100_PROFILE, **{"distributed.strategy": "fsdp"}))
    assert "accelerator_config" not in one and "ddp_find_unused_parameters" not in one


def test_deepspeed_optimizer_offload_gets_an_optimizer_section(tmp_path):
    ds = {"distributed.strategy": "deepspeed", "distributed.zero_stage": 2}
    off = training_arguments_kwargs(plan_for(tmp_path, hardware=H100_PROFILE, **ds, **{"distributed.offload_optimizer": True}))
    assert off["deepspeed"]["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    }
    plain = training_arguments_kwargs(plan_for(tmp_path, hardware=H100_PROFILE, **ds))
    assert "optimizer" not in plain["deepspeed"]


def test_a_rank_launched_with_the_wrong_world_size_is_refused(tmp_path, monkeypatch):
    from gpuplan.apply.launch.device import check_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ApplyError, match=r"2 process\(es\).*WORLD_SIZE=1.*gpuplan apply"):
        check_device(plan_for(tmp_path))  # count 2 on "cpu" run without torchrun
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert check_device(plan_for(tmp_path)) == "cpu"


def test_worker_refuses_an_unreadable_plan(tmp_path, capsys):
    from gpuplan.apply.launch.worker import main

    (tmp_path / "bad.json").write_text("{not json")
    assert main([str(tmp_path / "bad.json")]) == 1
    assert "not a readable gpuplan plan" in capsys.readouterr().err
