"""LoRA and QLoRA under FSDP2 on two CPU ranks over gloo, through the planned path: `gpuplan apply` of a
spec with model.method = "lora" / "qlora" and distributed.strategy = "fsdp" (torchrun, the Trainer,
accelerate's FSDP plugin on the PeftModel), against a one-process run of the same seed.

The base is the tiny Llama pretrained here (tests/helpers/lora_base.py). Its packed 32-token blocks all
carry the same number of tokens, so a step's mean loss does not depend on how the ranks split the 8
sequences: FSDP and one process must log the same loss per step up to float summation order.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import cli_runs
from tests.helpers.apply_plans import read_jsonl
from tests.helpers.lora_base import other_text, pretrain_base

LOSS_TOL = 2e-3  # absolute, on a loss of ~5.6; measured agreement ~1e-4 (qlora) and ~1e-6 (lora)
EFFECTIVE = 8
SEQ = 32


def spec(path, out, *, base, text, method="lora", count=2, strategy="fsdp", max_steps=4, save_steps=1000):
    distributed = f'strategy = "{strategy}"\n' + ('fsdp_sharding = "full_shard"\n' if strategy == "fsdp" else "")
    path.write_text(f"""
[model]
name_or_path = "{base}"
task = "causal-lm"
method = "{method}"

[lora]
r = 8
target_modules = ["q_proj", "v_proj"]

[hardware]
gpu = "cpu"
count = {count}

[data]
train_files = ["{text}"]
seq_len = {SEQ}

[training]
effective_batch_size = {EFFECTIVE}
per_device_train_batch_size = 2
learning_rate = 1e-2
lr_scheduler_type = "constant"
max_steps = {max_steps}
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
    return cli_runs.gpuplan(*args, timeout=400)


def results(out):
    return json.loads((out / "gpuplan-state.json").read_text())["results"]


def losses(out):
    return {m["step"]: m["loss"] for m in read_jsonl(out / "metrics.jsonl") if m["event"] == "train"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp-lora-base")
    return pretrain_base(tmp), other_text(tmp / "other.txt")


def _one_process(tmp_path_factory, base, method):
    tmp = tmp_path_factory.mktemp(f"one-{method}")
    r = gpuplan("apply", spec(tmp / "one.toml", tmp / "run", base=base[0], text=base[1], method=method, count=1, strategy="none"), "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return losses(tmp / "run")


@pytest.fixture(scope="module")
def one_lora(tmp_path_factory, base):
    return _one_process(tmp_path_factory, base, "lora")


@pytest.mark.slow
def test_fsdp_lora_matches_one_process_saves_the_adapter_only_and_resumes_exactly(tmp_path, base, one_lora):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    path = spec(tmp_path / "fsdp.toml", out, base=base[0], text=base[1], max_steps=2, save_steps=2)
    r = gpuplan("apply", path, "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "--nproc_per_node=2" in r.stdout
    res = results(out)
    # measured from the wrapped module: fully_shard units (2 decoder layers, embedding, tail, root), not DDP
    assert res["engine"] == "fsdp2 full_shard" and res["world_size"] == 2 and res["fsdp_units"] == 5
    # measured: the tokens both ranks consumed, all-gathered by the Trainer = 2 steps x the effective batch
    assert res["input_tokens_seen"] == 2 * EFFECTIVE * SEQ
    ckpt = out / "checkpoint-2"
    import torch

    # the Trainer's adapter_only FSDP save (torch get_model_state_dict ignore_frozen_params): the adapters; the
    # tiny base ties its head to the embedding, and that shared tensor's second name, lm_head.weight, slips through
    saved = torch.load(ckpt / "pytorch_model_fsdp.bin", weights_only=True)
    assert sorted(k for k in saved if "lora_" not in k) == ["base_model.model.lm_head.weight"]
    assert sum("lora_" in k for k in saved) == 8 and not any("base_layer" in k or "embed_tokens" in k for k in saved)

    path.write_text(path.read_text().replace("max_steps = 2", "max_steps = 4"))
    r = gpuplan("apply", path, "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"resuming the completed run from {ckpt}" in r.stdout
    res = results(out)
    assert res["start_step"] == 2 and res["global_step"] == 4 and res["engine"] == "fsdp2 full_shard"
    # adapter weights, Adam states and data position restored: steps 3-4 are the one-process run's
    fsdp = losses(out)
    assert sorted(fsdp) == [1, 2, 3, 4]
    assert fsdp == pytest.approx(one_lora, abs=LOSS_TOL)
    assert fsdp[4] < fsdp[1]
    # the plan's count per step (metrics.jsonl) and the Trainer's measured one agree: the effective batch
    steps = [m for m in read_jsonl(out / "metrics.jsonl") if m["event"] == "train"]
    assert [m["samples_seen"] for m in steps] == [EFFECTIVE * s for s in (1, 2, 3, 4)]
    assert res["input_tokens_seen"] == 4 * EFFECTIVE * SEQ  # both ranks' tokens; the count resumes with the state
    # the final dir holds the adapter only, gathered from the shards
    final = out / "final"
    assert "model.safetensors" not in os.listdir(final) and "adapter_config.json" in os.listdir(final)
    adapter = load_file(final / "adapter_model.safetensors")
    assert len(adapter) == 2 * 2 * 2 and all(".lora_A." in k or ".lora_B." in k for k in adapter)  # q, v x 2 layers
    assert all(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained (lora_B starts at 0)


@pytest.mark.slow
def test_fsdp_qlora_shards_the_4bit_base_on_two_cpu_ranks_and_matches_one_process(tmp_path_factory, tmp_path, base):
    one = _one_process(tmp_path_factory, base, "qlora")
    out = tmp_path / "run"
    r = gpuplan("apply", spec(tmp_path / "q.toml", out, base=base[0], text=base[1], method="qlora"), "--yes")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = results(out)
    assert res["engine"] == "fsdp2 full_shard" and res["method"] == "qlora"
    # bnb_4bit_quant_storage = the compute dtype (fp32 on CPU): every Linear4bit weight (7 linears x 2 layers)
    # is a DTensor shard, none left whole in FSDP's ignored_params
    assert res["four_bit_weights"] == {"sharded": 14, "whole": 0}
    assert losses(out) == pytest.approx(one, abs=LOSS_TOL)
    assert res["samples_seen"] == 4 * EFFECTIVE and res["input_tokens_seen"] == 4 * EFFECTIVE * SEQ
    assert "model.safetensors" not in os.listdir(out / "final")


def test_deepspeed_with_adapters_is_refused_on_cpu_with_the_reason(tmp_path, base):
    r = gpuplan("plan", spec(tmp_path / "ds.toml", tmp_path / "run", base=base[0], text=base[1], strategy="deepspeed"))
    assert r.returncode == 1
    assert 'distributed.strategy = "deepspeed" on hardware "cpu": DeepSpeed needs CUDA GPUs' in r.stdout + r.stderr


def _gpu_qlora_plan(tmp_path, **over):
    from tests.helpers.apply_plans import H100_PROFILE, cpu_plan

    values = {
        "model.method": "qlora",
        "hardware.count": 2,
        "distributed.strategy": "fsdp",
        "quantization.bnb_4bit_compute_dtype": "bfloat16",
        **over,
    }
    return cpu_plan(tmp_path, hardware=H100_PROFILE, **values)


def test_sharded_qlora_stores_4bit_in_the_compute_dtype_and_loads_on_the_host_only_with_offload(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from gpuplan.apply.model.quant4 import load_kwargs, loads_on_host

    off = _gpu_qlora_plan(tmp_path, **{"distributed.fsdp_cpu_offload": True})
    kw = load_kwargs(off, "cuda", AutoModelForCausalLM)
    assert kw["quantization_config"].bnb_4bit_quant_storage == torch.bfloat16  # FSDP2 shards it
    assert kw["device_map"] == {"": "cpu"} and loads_on_host(off, "cuda")  # never whole on one GPU
    on_gpu = _gpu_qlora_plan(tmp_path)
    assert load_kwargs(on_gpu, "cuda", AutoModelForCausalLM)["device_map"] == {"": 0} and not loads_on_host(on_gpu, "cuda")
    one = _gpu_qlora_plan(tmp_path, **{"hardware.count": 1, "distributed.strategy": "none"})
    assert load_kwargs(one, "cuda", AutoModelForCausalLM)["quantization_config"].bnb_4bit_quant_storage == torch.uint8
