"""What the spec fuzzer (tests/plan/test_fuzz_specs.py) found, kept as deterministic regressions.

Each case was a traceback, a hang or an error that named neither a key nor a file position.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan.plan.build import plan_file
from gpuplan.plan.types import PlanError
from tests.helpers.fuzz_oracle import check, check_rejection, write
from tests.helpers.fuzz_strategies import MODEL_CONFIGS
from tests.helpers.planning import ENV


@pytest.fixture
def work(tmp_path) -> Path:
    return tmp_path


M0 = f"[model]\nconfig = {json.dumps(MODEL_CONFIGS[0])}\n"
FOUND = {
    "empty key": (M0 + '[""]\n', '""', '[""]: unknown section'),
    "DEL in a key": (M0 + '[training]\n"a\\u007f" = 1\n', 'training."a\\u007f"', "unknown key"),
    "end of document": (M0 + "[", None, ":3:2: invalid TOML"),
    "NUL in a path": ('[model]\nconfig = "a\\u0000b"\n', "model.config", "NUL character"),
    "config name too long": (f'[model]\nconfig = "{"x" * 300}"\n[hardware]\ngpu = "H100"\n', "model.config", "too long"),
    "60k unknown keys": (  # found with 100k; a spec is now at most 1 MiB (spec/load.py), which 60k keys stay under
        M0 + "[training]\n" + "".join(f"k{i} = 1\n" for i in range(60_000)),
        "training.k20",
        "59980 more unknown keys in [training]",
    ),
    "deepspeed with an FSDP option": (
        M0 + '[hardware]\ngpu = "H100"\ncount = 8\n[distributed]\nstrategy = "deepspeed"\nfsdp_cpu_offload = true\n',
        "distributed.fsdp_cpu_offload",
        "DeepSpeed and FSDP cannot be used together",
    ),
}


@pytest.mark.parametrize("name", FOUND)
def test_found_by_the_fuzzer(work, name):
    text, key, summary = FOUND[name]
    path = write(work, text, "found.toml")
    with pytest.raises(PlanError) as e:
        plan_file(path, environment=ENV)
    check_rejection(path, e.value)
    first = e.value.diagnostics[-1] if name == "60k unknown keys" else e.value.diagnostics[0]
    assert first.key == key and summary in first.summary, first
    if name == "60k unknown keys":
        assert len(e.value.diagnostics) == 21


def test_found_hostile_depth_in_a_model_config_is_refused_not_counted(work):
    cfg = json.loads(Path(MODEL_CONFIGS[0]).read_text())
    cfg["num_hidden_layers" if "num_hidden_layers" in cfg else "n_layer"] = 10**6  # took 100 s to count
    (work / "deep.json").write_text(json.dumps(cfg))
    path = write(work, f'[model]\nconfig = "{work / "deep.json"}"\n[hardware]\ngpu = "H100"\n', "found.toml")
    with pytest.raises(PlanError, match=r"is invalid: expected an integer from \d+ to 4096"):
        plan_file(path, environment=ENV)


def test_found_user_offload_that_is_not_needed_is_changed_with_a_reason(work):
    path = write(
        work,
        M0 + '[hardware]\ngpu = "H100"\ncount = 8\n[distributed]\nfsdp_cpu_offload = true\n[training]\neffective_batch_size = 64\n',
        "found.toml",
    )
    assert check("paths", path) == "accepted"
