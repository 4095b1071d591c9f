"""Fuzzing the plan path: valid, near-valid and hostile specs never end in a traceback.

Every generated spec is a real file planned in-process with plan_file (a few go
through the real `gpuplan plan` command). Asserted for every example:
- never an exception other than PlanError (in-process) and never "Traceback" or
  "internal error" from the command;
- a rejection names a key path (Diagnostic.key) or the file, as `path:` or
  `path:line:col:` (every TOML syntax error carries a line and column);
- an accepted spec gives a plan whose invariants hold: effective batch = per-device
  x accumulation x GPUs x nodes; the plan fits and its reserved peak is under
  capacity x (1 - headroom); every change has a rule and a reason and matches the
  final setting; every setting's source is user|default|derived|adjusted; the
  user's effective batch, seq_len, learning rate and dtype are kept; the plan
  renders as strict JSON (no NaN), round-trips, and renders as text.

Profiles (GPUPLAN_FUZZ_PROFILE): "ci" (default; derandomized so CI is reproducible;
about 1,600 examples, ~40 s on 2 shared cores), "quick" (derandomized, a twentieth of ci:
`python benchmarks/fuzz.py --quick`, which tests/test_benchmarks.py runs) and "long" (random, ~20,700 examples):
`python benchmarks/fuzz.py` runs the long profile and records the counts per test and
the time in benchmarks/RESULTS.md ("Fuzzing"). Long run of 2026-11-29: 20,741 examples
in 282 s, all passing (after the fixes in tests/plan/test_fuzz_found.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cli_runs import BOOT, run
from tests.helpers.fuzz_oracle import RAN, check, write
from tests.helpers.fuzz_strategies import (
    FIXED_PATHS,
    MODEL_CONFIGS,
    PATH_VALUES,
    SMALL_TEXTS,
    apply_mutations,
    damaged_model_config,
    deep_text,
    mutation,
    text_damage,
    unicode_spec,
    valid_specs,
)
from tests.helpers.fuzz_toml import toml_doc
from tests.helpers.planning import ENV, ENV_NO_BNB, REPO

PROFILE = os.environ.get("GPUPLAN_FUZZ_PROFILE", "ci")
# Examples per test: (ci, long).
COUNTS = {
    "valid": (400, 6000),
    "near_valid": (400, 6000),
    "damaged_text": (150, 2000),
    "model_config": (100, 1500),
    "unicode": (200, 2500),
    "deep": (60, 600),
    "small": (25, 100),
    "bytes": (100, 1000),
    "paths": (100, 1000),
    "huge": (4, 12),
    "cli": (6, 40),
}
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("long", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(name: str):
    """@settings for one fuzz test under the chosen profile."""
    ci, long = COUNTS[name]
    n = {"ci": ci, "quick": max(1, ci // 20), "long": long}[PROFILE]
    return settings(settings.get_profile("ci" if PROFILE == "quick" else PROFILE), max_examples=n)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    out = os.environ.get("GPUPLAN_FUZZ_REPORT")
    if out:
        Path(out).write_text(json.dumps(dict(RAN), indent=1, sort_keys=True))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    (d / "config-dir").mkdir()
    (d / "bad.json").write_bytes(b"\xff\xfe{not json")
    for f in ("data/a.jsonl", "d/b.txt", "c.csv", "data/eval.jsonl"):  # the data files valid specs list (plan checks they exist)
        (d / f).parent.mkdir(exist_ok=True)
        (d / f).write_text('{"text": "a"}\n')
    return d


# ---- (a) valid ---------------------------------------------------------------------------
@pytest.mark.slow  # hundreds of examples planned in-process: the full run has them, the inner loop (-m "not slow") not
@fuzz("valid")
@given(data=st.data(), strict=st.booleans(), no_bnb=st.booleans())
def test_valid_specs_plan_or_reject_cleanly(work, data, strict, no_bnb):
    spec = data.draw(valid_specs(str(work / "out")))
    check("valid", write(work, toml_doc(spec)), strict=strict, env=ENV_NO_BNB if no_bnb else ENV)


# ---- (b) near-valid ----------------------------------------------------------------------
@pytest.mark.slow  # hundreds of examples planned in-process: the full run has them, the inner loop (-m "not slow") not
@fuzz("near_valid")
@given(data=st.data(), muts=st.lists(mutation(), min_size=1, max_size=3))
def test_near_valid_specs_name_the_key(work, data, muts):
    spec = apply_mutations(data.draw(valid_specs(str(work / "out"))), muts)
    check("near_valid", write(work, toml_doc(spec)))


@pytest.mark.slow  # hundreds of examples planned in-process: the full run has them, the inner loop (-m "not slow") not
@fuzz("damaged_text")
@given(data=st.data())
def test_damaged_toml_names_the_position(work, data):
    text = toml_doc(data.draw(valid_specs(str(work / "out"))))
    check("damaged_text", write(work, data.draw(text_damage(text))))


@pytest.mark.slow  # hundreds of examples planned in-process: the full run has them, the inner loop (-m "not slow") not
@fuzz("model_config")
@given(cfg=damaged_model_config(), data=st.data())
def test_hostile_model_config_is_an_error_on_model_config(work, cfg, data):
    (work / "model.json").write_text(cfg)
    spec = data.draw(valid_specs(str(work / "out")))
    spec["model"]["config"] = str(work / "model.json")
    check("model_config", write(work, toml_doc(spec)))


# ---- (c) hostile -------------------------------------------------------------------------
@fuzz("unicode")
@given(doc=unicode_spec())
def test_random_unicode_keys_and_values(work, doc):
    check("unicode", write(work, toml_doc(doc)))


@fuzz("deep")
@given(text=deep_text())
def test_deep_nesting(work, text):
    check("deep", write(work, text))


@fuzz("small")
@given(text=SMALL_TEXTS)
def test_empty_and_tiny_files(work, text):
    check("small", write(work, text))


@fuzz("bytes")
@given(blob=st.one_of(st.binary(max_size=4000), st.binary(min_size=1, max_size=8).map(lambda b: b"[model]\n" + b)))
def test_binary_garbage(work, blob):
    check("bytes", write(work, blob))


PATH_KEYS = ["model.config", "model.name_or_path", "output.dir", "data.train_files"]


@fuzz("paths")
@given(
    key=st.sampled_from(PATH_KEYS),
    value=PATH_VALUES,
    gpu=st.one_of(st.none(), st.text(max_size=20), st.sampled_from(["cpu", "auto", "H100"])),
)
def test_hostile_paths_and_gpu_overrides(work, key, value, gpu):
    spec = {"model": {"config": MODEL_CONFIGS[0]}, "hardware": {"gpu": "A100-80GB"}}
    section, name = key.split(".")
    spec.setdefault(section, {})[name] = [value] if name == "train_files" else value
    overrides = {"hardware": {"gpu": gpu}} if gpu else None
    check("paths", write(work, toml_doc(spec)), overrides=overrides)


@pytest.mark.parametrize("value", FIXED_PATHS, ids=range(len(FIXED_PATHS)))
def test_every_hostile_path_in_every_path_key(work, value):
    for key in PATH_KEYS:
        test_hostile_paths_and_gpu_overrides.hypothesis.inner_test(work, key, value, None)


def test_a_directory_a_missing_file_or_an_absurd_name_as_the_spec(work):
    for path in (work, work / "no-such.toml", work / ("x" * 300), work / "/".join(["d"] * 3000), Path("/dev/null")):
        assert check("paths", path) == "rejected"


@fuzz("huge")
@given(kind=st.sampled_from(["comment", "string", "list", "keys", "over_limit"]), kib=st.integers(256, 1000))
def test_files_up_to_and_over_the_size_limit(work, kind, kib):
    """Large files under the 1 MiB limit (gpuplan/spec/load.py MAX_SPEC_BYTES) are parsed and rejected
    cleanly; one over it is refused before parsing."""
    n = kib * 1024
    head = f"[model]\nconfig = {json.dumps(MODEL_CONFIGS[0])}\n"
    if kind == "comment":
        text = head + "#" + "x" * n + "\n"
    elif kind == "string":
        text = head + f'[hardware]\ngpu = "{"A" * n}"\n'
    elif kind == "list":
        text = head + "[data]\ntrain_files = [" + ",".join(['"f"'] * (n // 4)) + "]\n"
    elif kind == "keys":
        text = head + "[training]\n" + "".join(f"k{i} = {i}\n" for i in range(n // 16))
    else:
        text = head + "#" * (1024 * 1024)
    assert check("huge", write(work, text, "huge.toml")) == "rejected"


# ---- the real command --------------------------------------------------------------------
CLI_INPUTS = st.one_of(
    valid_specs("out").map(toml_doc),
    st.tuples(valid_specs("out"), st.lists(mutation(), min_size=1, max_size=2)).map(lambda t: toml_doc(apply_mutations(*t))),
    unicode_spec().map(toml_doc),
    deep_text(),
    SMALL_TEXTS,
    st.binary(max_size=200),
)


@pytest.mark.slow
@fuzz("cli")
@given(content=CLI_INPUTS, as_json=st.booleans())
def test_cli_never_prints_a_traceback(work, content, as_json):
    RAN["cli"] += 1
    spec = write(work, content, "cli.toml")
    env = {k: v for k, v in os.environ.items() if k != "GPUPLAN_DEBUG"}
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{BOOT}"  # as cli_runs gives it: a worker's running fork server serves it
    cmd = [sys.executable, "-m", "gpuplan.cli", "plan", str(spec), "--no-color", "--gpu", "A100-80GB"]
    r = run(cmd + (["--json"] if as_json else []), capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if r.returncode == 0 and as_json:
        json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the plan JSON"))
    if r.returncode == 1:
        assert r.stderr.strip()
    RAN[f"cli:exit{r.returncode}"] += 1
