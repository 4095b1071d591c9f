"""Resume drift with adapters: method, [lora] and [quantization] changes break a resume only
when they change what the run trains (full plans carry both sections' defaults too)."""

from __future__ import annotations

from gpuplan.lifecycle.drift import resume_conflicts
from tests.helpers.apply_plans import cpu_plan


def _pair(tmp_path, before: dict, after: dict) -> list[str]:
    return resume_conflicts(cpu_plan(tmp_path, **before), cpu_plan(tmp_path, **after))


def test_switching_method_breaks_resume(tmp_path):
    assert _pair(tmp_path, {}, {"model.method": "lora"}) == [
        "model.method: 'full' -> 'lora' changes what is trained (every weight, or adapters on a frozen base)"
    ]


def test_lora_settings_break_an_adapter_run_but_not_a_full_one(tmp_path):
    lora = {"model.method": "lora"}
    assert _pair(tmp_path, {**lora, "lora.r": 8}, {**lora, "lora.r": 16}) == [
        "lora.r: 8 -> 16 changes the adapter shapes (the checkpoint would not load)"
    ]
    targets = {**lora, "lora.target_modules": ["q_proj"]}
    assert [c.split(":")[0] for c in _pair(tmp_path, lora, targets)] == ["lora.target_modules"]
    assert _pair(tmp_path, {"lora.r": 8}, {"lora.r": 16}) == []  # method full: [lora] is not read


def test_quantization_settings_break_only_a_qlora_run(tmp_path):
    q = {"quantization.bnb_4bit_quant_type": "fp4"}
    assert _pair(tmp_path, {"model.method": "qlora"}, {"model.method": "qlora", **q}) == [
        "quantization.bnb_4bit_quant_type: 'nf4' -> 'fp4' changes the 4-bit base the adapters were trained on"
    ]
    assert _pair(tmp_path, {"model.method": "lora"}, {"model.method": "lora", **q}) == []


def test_merge_adapter_does_not_break_resume(tmp_path):
    lora = {"model.method": "lora"}
    assert _pair(tmp_path, lora, {**lora, "output.merge_adapter": True}) == []
