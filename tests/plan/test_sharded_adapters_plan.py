"""LoRA / QLoRA under FSDP and DeepSpeed ZeRO planned part by part, host RAM per node, and the time terms.

Torch-free: the analytic model (memory/adapters_sharded.py, memory/host.py, plan/estimate/comm_time.py) and
whole plans of specs written here.
"""

from __future__ import annotations

import json
import re

import pytest

from gpuplan.hardware.catalog import lookup
from gpuplan.modelinfo import model_facts, read_config
from gpuplan.modelinfo.lora_targets import resolve_targets
from gpuplan.plan.estimate.comm_time import TERMS, sharded_step_terms
from gpuplan.plan.estimate.memory.adapters_sharded import base_parts, sharded_adapter_states
from gpuplan.plan.estimate.memory.estimate import estimate_memory
from gpuplan.plan.estimate.memory.types import Adapters, Workload
from gpuplan.plan.types import PlanError
from tests.helpers.planning import ENV, MODELS, SPECS, plan_text

GIB = 1024**3
F70 = model_facts(read_config(MODELS / "llama-3.1-70b.json"))
ALL = tuple(resolve_targets(F70, "all-linear", []))


def wl(method="qlora", engine="fsdp", stage=3, n=2, offload=False, **kw):
    fields = dict(
        per_device_batch=1,
        seq_len=2048,
        weight_dtype="bfloat16",
        amp="bf16",
        gradient_checkpointing=True,
        attn_implementation="flash_attention_2",
        optim="adamw_torch",
    )
    fields.update(kw)
    return Workload(
        **fields,
        engine=engine,
        zero_stage=stage,
        shard_world_size=n,
        offload_params=offload,
        offload_optimizer=offload,
        adapters=Adapters(method=method, r=16, target_modules=ALL),
    )


def test_full_shard_halves_the_4bit_base_and_keeps_the_quant_states_whole():
    base = base_parts(F70, True, True, 4, 2)
    # 68.45B 4-bit values: 34.2 GB packed (sharded) + the double-quantized absmax (whole on every GPU)
    assert 1.0 * GIB < base.replicated < 1.1 * GIB
    sh = sharded_adapter_states(F70, wl(), 207_093_760, 0, (), "adamw")
    assert sh.weights - 4 * 207_093_760 // 2 == pytest.approx(base.shardable / 2 + base.replicated, abs=8)
    # in a layer's backward: that layer and the next prefetched (bf16 gathered) with their adapters' gradients
    assert sh.gathered_last_layer == 2 * base.layer_gathered + 4 * 2 * (207_093_760 // 80)
    ddp = estimate_memory(F70, wl(engine="ddp", stage=0)).components["weights"]
    assert sh.weights + sh.gathered_last_layer < 0.6 * ddp  # half the base, the QuantStates, two gathered layers


def test_shard_grad_op_keeps_every_unit_gathered_so_it_saves_nothing_on_a_frozen_base():
    sgo = sharded_adapter_states(F70, wl(stage=2), 207_093_760, 0, (), "adamw")
    full = sharded_adapter_states(F70, wl(), 207_093_760, 0, (), "adamw")
    assert sgo.gathered_forward > 30 * GIB > full.gathered_forward  # the whole base stays gathered until backward


def test_cpu_offload_moves_shards_grads_and_states_to_pinned_host_ram():
    sh = sharded_adapter_states(F70, wl(offload=True), 207_093_760, 0, (), "adamw")
    base = base_parts(F70, True, True, 4, 2)
    assert sh.weights == base.replicated and sh.grads == sh.states == 0
    shard = -(-base.shardable // 2)
    assert sh.host_bytes == shard + 16 * (207_093_760 // 2)  # base shard + fp32 adapters, grads, 2 Adam states
    assert sh.pinned_bytes == shard + 4 * (207_093_760 // 2)


def test_deepspeed_zero3_partitions_the_base_and_keeps_fp32_states_only_for_the_adapters():
    sh = sharded_adapter_states(F70, wl(engine="deepspeed"), 207_093_760, 0, (), "adamw")
    part = 207_093_760 // 2
    assert sh.states == pytest.approx(12 * part, abs=64) and sh.grads == 4 * part  # master + Adam, fp32 grad partition
    assert sh.weights < 25 * GIB
    off = sharded_adapter_states(F70, wl(engine="deepspeed", offload=True), 207_093_760, 0, (), "adamw")
    assert off.states == 0 and off.host_bytes > 16 * GIB


def test_qlora_without_offload_counts_the_whole_4bit_load_on_each_gpu():
    est = estimate_memory(F70, wl(seq_len=128))
    assert est.components["weights"] > 40 * GIB  # loaded whole onto each GPU before fully_shard


def test_time_terms_are_named_and_additive():
    gpu = lookup("RTX-4090", None)
    on = sharded_step_terms(F70, wl(offload=True), gpu, count=2, nodes=1)
    off = sharded_step_terms(F70, wl(), gpu, count=2, nodes=1)
    assert tuple(on) == TERMS and all(v > 0 for v in on.values())
    assert off["all_gather_s"] == on["all_gather_s"] > 0 and off["host_to_device_s"] == off["cpu_optimizer_step_s"] == 0
    assert sharded_step_terms(F70, wl(engine="ddp", stage=0), gpu, count=2, nodes=1) == dict.fromkeys(TERMS, 0.0)


def _spec70(tmp_path, host=128, method="qlora", strategy="auto", count=2):
    text = (SPECS / "llama-70b-qlora-2x4090.toml").read_text()
    text = text.replace('"models/', f'"{MODELS}/').replace('"data/', f'"{SPECS}/data/')
    text = text.replace("host_memory_gib = 128", f"host_memory_gib = {host}").replace("count = 2", f"count = {count}")
    text = text.replace('method = "qlora"', f'method = "{method}"')
    if strategy == "auto":
        text = text.replace('strategy = "fsdp"\nfsdp_sharding = "full_shard"\nfsdp_cpu_offload = true', 'strategy = "auto"')
    return text


def test_auto_strategy_picks_fsdp_offload_for_70b_qlora_on_two_4090s(tmp_path):
    plan = plan_text(tmp_path, _spec70(tmp_path))
    assert plan.memory.fits and plan.memory.layout == "FSDP full_shard + CPU offload"
    assert plan.value("distributed.strategy") == "fsdp" and plan.value("distributed.fsdp_cpu_offload") is True
    comm = plan.throughput.communication
    assert set(comm["terms"]) == set(TERMS) and comm["time_s"] == pytest.approx(sum(comm["terms"].values()))


def test_host_ram_too_small_is_refused_with_the_parts_and_a_fix_that_works(tmp_path):
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, _spec70(tmp_path, host=64))
    d = next(d for d in e.value.diagnostics if d.severity == "error")
    assert "but its host RAM does not: it needs 81 GiB of host RAM per node (2 ranks)" in d.detail
    assert "every rank loads the whole 4-bit base into host RAM" in d.detail and "58 GiB usable" in d.detail
    assert "hardware.count = 1, hardware.nodes = 2" in d.fix and "hardware.host_memory_gib = 91" in d.fix
    fixed = _spec70(tmp_path, host=64, count=1).replace("[data]", "nodes = 2\n\n[data]")
    plan = plan_text(tmp_path, fixed)
    assert plan.memory.fits and plan.memory.host["peak_bytes"] <= 0.9 * 64 * GIB


def test_loading_beyond_the_host_ram_is_refused_outside_the_fit_search(tmp_path):
    # LoRA on a bf16 70B, fully sharded over 8 H100s without offload: every rank loads the whole model
    text = _spec70(tmp_path, host=512, method="lora").replace('"RTX-4090"', '"H100-80GB"').replace("count = 2", "count = 8")
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text)
    d = next(d for d in e.value.diagnostics if d.severity == "error")
    assert d.key == "hardware.host_memory_gib"
    assert "loading 1051 GiB (every rank loads the whole bfloat16 model)" in d.summary
    assert "hardware.count = 2, hardware.nodes = 4" in d.fix


def test_unknown_host_ram_is_noted_with_the_ram_needed(tmp_path):
    text = _spec70(tmp_path).replace("host_memory_gib = 128\n", "")
    plan = plan_text(tmp_path, text)
    notes = [d for d in plan.diagnostics if d.key == "hardware.host_memory_gib"]
    assert notes and "81 GiB of host RAM per node" in notes[0].summary and "at least 91" in notes[0].fix


def test_full_70b_on_two_4090s_names_the_sharded_qlora_that_fits_with_its_host_ram(tmp_path):
    text = _spec70(tmp_path, method="full").replace('[lora]\nr = 16\ntarget_modules = "all-linear"\n', "")
    with pytest.raises(PlanError) as e:
        plan_text(tmp_path, text)
    d = next(d for d in e.value.diagnostics if d.severity == "error")
    # the fit takes the largest batch that fits: with the chunked loss that is 4 here
    assert re.search(
        r"qlora needs [\d.]+ GiB of 22.1 usable \(per-device batch \d+, (chunked cross-entropy, )?"
        r"FSDP full_shard \+ CPU offload; host RAM 81 GiB per node\)",
        d.detail,
    ), d.detail


def test_deepspeed_adapters_planned_for_gpus_with_what_the_target_needs(tmp_path):
    text = _spec70(tmp_path, host=512).replace('"RTX-4090"', '"A100-80GB"').replace('strategy = "auto"', 'strategy = "deepspeed"')
    plan = plan_text(tmp_path, text, env=ENV)  # a named GPU: another machine, whose packages are not known here
    assert plan.memory.layout.startswith("DeepSpeed ZeRO-") and plan.memory.fits
    assert any("DeepSpeed" in n and "trainable" in n for n in plan.memory.notes)
    target_notes = [d.summary for d in plan.diagnostics if d.key == "distributed.strategy"]
    assert any("needs the deepspeed package on the training machines" in s for s in target_notes), target_notes


def test_plan_json_carries_the_host_section(tmp_path):
    plan = plan_text(tmp_path, _spec70(tmp_path))
    d = json.loads(json.dumps(plan.to_dict()))["memory"]["host"]
    assert set(d) == {"loading_bytes", "offloaded_bytes", "pinned_bytes", "peak_bytes", "loading"}


def test_published_fsdp_full_shard_rows_within_15_percent_median():
    import statistics
    import sys

    sys.path.insert(0, str(SPECS.parent / "benchmarks"))
    from fsdp_adapters import run

    rows = run(write=False)
    assert {r["offload"] for r in rows} == {True, False} and len(rows) >= 15
    assert statistics.median(abs(r["err"]) for r in rows) <= 0.15


def test_compare_shows_sharded_qlora_rows_for_70b_on_24gb_cards(tmp_path):
    from gpuplan.plan.compare import compare
    from gpuplan.spec.load import load_toml

    path = tmp_path / "q.toml"
    path.write_text(_spec70(tmp_path))  # strategy "auto"
    rows = compare(load_toml(path), gpus=["RTX-4090"], counts=[1, 2], environment=ENV)
    by = {r["count"]: r for r in rows}
    assert not by[1]["fits"]
    assert by[2]["fits"] and by[2]["sharding"] == "FSDP full_shard + CPU offload"
    assert 75 * GIB < by[2]["host_ram_per_node_bytes"] < 90 * GIB
