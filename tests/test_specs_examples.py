"""Every spec in specs/ is planned (torch-free) and does what its comment promises."""

import pytest

from gpuplan.plan.build import plan_file
from gpuplan.plan.types import PlanError
from tests.helpers.planning import ENV, SPECS

CANNOT_FIT = {"mistral-7b-24gb.toml"}


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.toml")), ids=lambda p: p.name)
def test_every_example_spec_plans(path):
    if path.name in CANNOT_FIT:
        with pytest.raises(PlanError, match="does not fit: needs .* at per-device batch 1 with every saver on"):
            plan_file(path, environment=ENV)
        return
    plan = plan_file(path, environment=ENV)
    assert plan.memory.fits
    assert plan.memory.reserved_peak_bytes <= plan.memory.usable_bytes
    e = plan.value("training.effective_batch_size")
    world = plan.value("hardware.count") * plan.value("hardware.nodes")
    assert e == plan.value("training.per_device_train_batch_size") * plan.value("training.gradient_accumulation_steps") * world
    assert all(c.reason for c in plan.changes)


def test_8b_on_a100_uses_bf16_and_fits():
    plan = plan_file(SPECS / "llama-8b-a100.toml", environment=ENV)
    assert plan.model.n_params == 8_030_261_248
    assert plan.value("training.bf16") is True
    assert plan.memory.capacity_bytes == 80 * 1024**3


def test_24gb_card_needs_8bit_and_checkpointing():
    plan = plan_file(SPECS / "phi-2-24gb.toml", environment=ENV)
    # the chunked loss (a few %) before checkpointing (20%): cheapest slowdown first
    assert [s.name for s in plan.memory.savers] == ["8-bit optimizer", "chunked cross-entropy", "gradient checkpointing"]


def test_every_plan_round_trips_through_its_typed_sections(shipped_plans):
    """The JSON contract lives in the typed sections: from_dict(to_dict()) loses nothing, adds nothing."""
    import json

    from gpuplan.plan.types import Plan

    assert len(shipped_plans) == len(list(SPECS.glob("*.toml"))) - len(CANNOT_FIT)
    for plan in shipped_plans.values():
        data = plan.to_dict()
        again = Plan.from_dict(json.loads(json.dumps(data)))
        assert again == plan
        assert again.to_dict() == data
        for section in ("hardware", "model", "memory", "throughput"):  # key order too: --json is byte-stable
            assert list(again.to_dict()[section]) == list(data[section])


def test_8b_lora_dpo_prints_the_reference_choice_and_the_doubled_sequences():
    from gpuplan.render.text import render_plan

    plan = plan_file(SPECS / "llama-8b-lora-dpo.toml", environment=ENV)
    text = render_plan(plan.to_dict())
    assert (
        '+ preference.reference = "adapters-off"\n      lora: the reference is the base with adapters disabled '
        "(peft), no second copy of the weights"
    ) in text
    b = plan.value("training.per_device_train_batch_size")
    assert f"per-device batch {b} examples = {2 * b} sequences of 2048 tokens" in text
    # memory at full length; the time at the length TRL pads the demo's short pairs to (plan/estimate/padding.py)
    assert plan.memory.workload.seq_len == 2048
    assert "expected 9 of 2048 tokens, from the 32 rows of preference-pairs.jsonl" in plan.throughput.assumption
    assert plan.throughput.tokens_per_step == 64 * 2 * 9


def test_70b_qlora_on_two_4090s_fits_with_fsdp_offload_and_names_its_host_ram():
    plan = plan_file(SPECS / "llama-70b-qlora-2x4090.toml", environment=ENV)
    mem = plan.memory
    assert mem.fits and mem.layout == "FSDP full_shard + CPU offload"
    assert mem.reserved_peak_bytes <= 22 * 1024**3 < plan.hardware.memory_bytes  # a 24 GB card
    # every rank loads the whole 4-bit base (33 GiB packed + 7.8 GiB fp32 rest) into host RAM first
    host = mem.host
    assert host["loading"] == "every rank loads the whole 4-bit base into host RAM"
    assert 75 * 1024**3 < host["loading_bytes"] == host["peak_bytes"] < 90 * 1024**3
    assert host["offloaded_bytes"] > 2 * 19 * 1024**3  # each rank's half of the base, in host RAM
    assert host["peak_bytes"] <= 0.9 * plan.value("hardware.host_memory_gib") * 1024**3
    assert any("quant_storage" in n for n in mem.notes)
    import re

    from gpuplan.render.text import render_memory

    assert re.search(r"host RAM per node +8\d\.\d GiB", "\n".join(render_memory(mem, plan.hardware)))
