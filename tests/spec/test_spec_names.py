"""The names shipped as data match the installed transformers and torch."""

import pytest

from gpuplan.spec import names


def test_optimizer_names_match_transformers():
    ta = pytest.importorskip("transformers.training_args")
    assert set(names.OPTIMIZER_NAMES) == {o.value for o in ta.OptimizerNames}
    assert not set(names.REMOVED_OPTIMIZERS) & set(names.OPTIMIZER_NAMES)


def test_scheduler_types_match_transformers():
    tu = pytest.importorskip("transformers.trainer_utils")
    assert set(names.SCHEDULER_TYPES) == {s.value for s in tu.SchedulerType}


def test_compile_backends_exist_in_torch():
    dynamo = pytest.importorskip("torch._dynamo")
    assert set(names.COMPILE_BACKENDS) <= set(dynamo.list_backends(exclude_tags=()))


def test_compile_backends_are_accepted_by_accelerate():
    """Issue 11 item 4: the Trainer hands the backend to accelerate's TorchDynamoPlugin."""
    from accelerate.utils import DynamoBackend

    for name in names.COMPILE_BACKENDS:
        DynamoBackend(name.upper())  # raises ValueError for torch-only names (ts, openxla, aot_ts, ...)
