"""plan/tune.py: the candidates `gpuplan tune` times come from the fit search's space, each planned in full."""

from __future__ import annotations

from gpuplan.plan.inputs.environment import local_environment
from gpuplan.plan.tune import tune_candidates
from gpuplan.spec.load import load_toml
from tests.helpers.cli_runs import tiny_spec


def test_candidates_split_the_same_batch_toggle_checkpointing_and_plan_what_they_say(tmp_path):
    spec = tiny_spec(tmp_path / "tiny.toml", tmp_path / "run", max_steps=30, seq_len=64, batch=8)
    base, found, dropped = tune_candidates(load_toml(spec), detect=None, environment=local_environment(), top=20, planned=20)
    assert {(c.per_device_batch, c.accumulation) for c in found} == {(8, 1), (4, 2), (2, 4), (1, 8)}  # every split of 8
    assert {c.plan.value("training.gradient_checkpointing") for c in found} == {True, False}
    for c in found:
        assert c.per_device_batch * c.accumulation == base.value("training.effective_batch_size")
        assert all(c.plan.value(k) == v for k, v in c.settings.items())  # its plan runs exactly its settings
        assert c.plan.memory.fits
    tps = [c.plan.throughput.tokens_per_second for c in found]
    assert tps == sorted(tps, reverse=True)  # the fastest planned first
    assert len({c.fingerprint for c in found}) == len(found)

    top2 = tune_candidates(load_toml(spec), detect=None, environment=local_environment(), top=2)[1]
    assert [c.label for c in top2] == [c.label for c in found[:2]]
