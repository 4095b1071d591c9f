"""The typed plan sections: a missing key reads as None, an unknown key is refused."""

import pytest

from gpuplan.plan.estimate.memory.types import Workload
from gpuplan.plan.sections import HardwareSection, MemorySection, Saver, ThroughputSection


def test_missing_keys_read_as_none_and_unknown_keys_are_refused():
    mem = MemorySection.from_dict({"allocated_peak_bytes": 5})
    assert mem.allocated_peak_bytes == 5 and mem.fits is None and mem.savers == ()
    with pytest.raises(ValueError, match="memory: unknown key.*adapter_bytes"):
        MemorySection.from_dict({"adapter_bytes": 1})


def test_nested_parts_come_back_typed_and_go_out_as_json():
    d = {
        "savers": [{"name": "gradient checkpointing", "saved_bytes": 10, "cost": "~33% slower"}],
        "workload": {"per_device_batch": 2, "seq_len": 16},
    }
    mem = MemorySection.from_dict(d)
    assert mem.savers == (Saver("gradient checkpointing", 10, "~33% slower"),)
    assert mem.workload == Workload(per_device_batch=2, seq_len=16)
    out = mem.to_dict()
    assert out["savers"] == d["savers"] and out["workload"]["seq_len"] == 16
    assert "traced" not in out  # only `plan --trace` adds it


def test_hardware_world_size_and_cc_as_list():
    hw = HardwareSection.from_dict({"name": "H100-80GB", "compute_capability": [9, 0], "count": 8, "nodes": 2})
    assert hw.world_size == 16 and hw.compute_capability == (9, 0)
    assert hw.to_dict()["compute_capability"] == [9, 0]
    assert ThroughputSection().empty and not ThroughputSection(tokens_per_step=1).empty
