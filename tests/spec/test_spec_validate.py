import pytest

from gpuplan.plan.types import PlanError
from gpuplan.spec.validate import validate_spec


def errors(raw):
    with pytest.raises(PlanError) as e:
        validate_spec(raw)
    return e.value.diagnostics


def test_misspelled_key_suggests_the_train_batch_key():
    (d,) = errors({"model": {"config": "c.json"}, "training": {"per_device_batch_size": 4}})
    assert d.key == "training.per_device_batch_size"
    assert "did you mean per_device_train_batch_size" in d.summary
    assert d.fix == "rename training.per_device_batch_size to training.per_device_train_batch_size"


def test_key_in_the_wrong_section_is_pointed_to_its_section():
    (d,) = errors({"model": {"config": "c.json"}, "training": {"seq_len": 512}})
    assert "belongs in [data]" in d.summary


def test_all_errors_reported_together_with_key_value_and_allowed():
    ds = errors(
        {
            "model": {"config": "c.json", "task": "clm"},
            "training": {"bf16": "yes", "per_device_train_batch_size": -3, "learning_rate": float("nan"), "optim": "adamw_8bt"},
            "hardware": 5,
            "bogus": {},
        }
    )
    by_key = {d.key: d.summary for d in ds}
    assert by_key["model.task"].startswith('model.task = "clm": should be')
    assert "'causal-lm'" in by_key["model.task"]
    assert by_key["training.bf16"] == 'training.bf16 = "yes": should be true or false or "auto"'
    assert ">= 1" in by_key["training.per_device_train_batch_size"]
    assert "finite" in by_key["training.learning_rate"]
    assert "did you mean adamw_8bit" in by_key["training.optim"]
    assert by_key["hardware"].startswith("[hardware] must be a table")
    assert "unknown section" in by_key["bogus"]
    assert len(ds) == 7


def test_model_needs_a_source_and_types_are_strict():
    ds = errors({"model": {}, "training": {"seed": True, "max_steps": "10"}})
    keys = {d.key for d in ds}
    assert keys == {"model", "training.seed", "training.max_steps"}


def test_huge_numbers_are_refused_not_computed():
    ds = errors({"model": {"config": "c"}, "training": {"effective_batch_size": 10**30}})
    assert ds[0].key == "training.effective_batch_size"


def test_valid_minimal_spec_and_defaults():
    spec = validate_spec({"model": {"config": "c.json"}})
    assert spec.training.per_device_train_batch_size == "auto"
    assert spec.hardware.headroom == 0.08
    assert spec.model.task == "causal-lm"


def test_removed_optimizer_is_accepted_for_the_planner_to_resolve():
    spec = validate_spec({"model": {"config": "c"}, "training": {"optim": "adamw_apex_fused"}})
    assert spec.training.optim == "adamw_apex_fused"
