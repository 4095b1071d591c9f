"""`gpuplan schema` gives every closed set of values as an enum, equal to what gpuplan accepts.

The schema is walked key by key (nothing is listed by hand): a string key whose validation
refuses a made-up value must carry an enum; every enum value is accepted, and a near miss of
each is refused, by the same checks `gpuplan plan` runs (spec/validate.py, and for
preference.loss_type the preference rule, which checks the loss against the objective's).
hardware.gpu is not a closed set: lookup (hardware/catalog.py) takes any case, aliases and
unique fragments ("4090"), so an enum would refuse specs gpuplan plans; validation accepts
a made-up name there (the plan refuses it), and the walk leaves it out for that reason.
The errors keep their did-you-mean hints (tests/spec/test_spec_validate.py,
tests/plan/test_preference_plan.py); the schema only adds the list an editor can offer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuplan.errors import GpuplanError
from gpuplan.plan.build import plan_file
from gpuplan.plan.types import PlanError
from gpuplan.spec.objectives import NEEDS_LABEL_SMOOTHING, OBJECTIVES
from gpuplan.spec.schema import Spec
from gpuplan.spec.validate import validate_spec
from tests.helpers.cli_runs import gpuplan
from tests.helpers.planning import ENV, SPECS

MADE_UP = "zz-not-a-value"
BASE: dict[str, Any] = {"model": {"config": "config.json"}}
LLAMA_8B = str(SPECS / "models" / "llama-3.1-8b.json")
# keys a rule checks after validation, planned with the objective whose rule reads them
# (rl.loss_type under grpo: tests/plan/test_rl_plan.py test_rl_loss_type_enum_is_every_loss_grpo_plans)
RULE_CHECKED = {"preference.loss_type", "rl.loss_type"}
# keys whose values are open (any name) but checked by their form: a made-up value is refused, no enum could list them
OPEN_FORMS = {
    "launch.storage_bucket": "a bucket URL, any bucket under a scheme SkyPilot mounts (spec/buckets.py)",
    "launch.ray_dashboard_address": "an http(s) URL, any host: the Ray dashboard's address",
}


def _cli_schema() -> dict:
    r = gpuplan("schema")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def string_keys(s: dict) -> dict[str, dict]:
    """section.key -> its schema, for every key a string can be given to (alone or in an anyOf)."""
    out = {}
    for section, ref in s["properties"].items():
        d = s["$defs"][ref.get("$ref", "").split("/")[-1]] if "$ref" in ref else ref
        for key, prop in d.get("properties", {}).items():
            if prop.get("type") == "string" or any(b.get("type") == "string" for b in prop.get("anyOf", [])):
                out[f"{section}.{key}"] = prop
    return out


def enum_of(prop: dict) -> list | None:
    """The enum of a key's string values: its own, or its string branch's (a const is a one-value set)."""
    if "enum" in prop:
        return prop["enum"]
    values = [v for b in prop.get("anyOf", []) for v in (b.get("enum") or ([b["const"]] if "const" in b else []))]
    return values or None


def refuses(key: str, value: Any) -> bool:
    """Does validation (spec/validate.py: Pydantic, then the optimizer check) refuse `value` at `key`,
    naming the key?"""
    section, name = key.split(".")
    raw = {**BASE, section: {**BASE.get(section, {}), name: value}}
    try:
        validate_spec(raw)
    except GpuplanError as e:
        return any(d.key == key for d in e.diagnostics)
    return False


SCHEMA = Spec.model_json_schema()  # what `gpuplan schema` prints, less its $schema and title
KEYS = string_keys(SCHEMA)


def test_the_cli_prints_this_schema():
    printed = _cli_schema()
    assert printed.pop("$schema").startswith("https://json-schema.org/") and printed.pop("title") == "gpuplan spec (format 1)"
    assert printed == {k: v for k, v in json.loads(json.dumps(SCHEMA)).items() if k != "title"}


def test_every_key_validation_closes_to_a_set_carries_that_set_as_an_enum():
    closed = [k for k in KEYS if k not in RULE_CHECKED and k not in OPEN_FORMS and refuses(k, MADE_UP)]
    assert all(k in KEYS and refuses(k, MADE_UP) for k in OPEN_FORMS)  # still string keys that refuse a made-up value
    assert {"training.objective", "training.optim", "model.task", "model.method", "data.format"} <= set(closed)
    missing = [k for k in closed if enum_of(KEYS[k]) is None]
    assert not missing, f"closed sets with no enum in `gpuplan schema`: {missing}"


@pytest.mark.parametrize("key", sorted(k for k, p in KEYS.items() if enum_of(p) and k not in RULE_CHECKED))
def test_each_enum_is_exactly_what_validation_accepts(key):
    values = [v for v in enum_of(KEYS[key]) if isinstance(v, str)]
    refused = [v for v in values if refuses(key, v)]
    assert not refused, f"{key}: the schema offers {refused}, validation refuses them"
    near_misses = [v + "x" for v in values if v + "x" not in values and not refuses(key, v + "x")]
    assert not near_misses, f"{key}: validation accepts {near_misses}, which the schema's enum does not list"


def _dpo(tmp_path, objective: str, loss: str):
    spec = tmp_path / f"{objective}-{loss}.toml"
    spec.write_text(
        f'[model]\nconfig = "{LLAMA_8B}"\nmethod = "lora"\ndtype = "bfloat16"\n[hardware]\ngpu = "A100-80GB"\n'
        f'[data]\nseq_len = 2048\n[training]\nobjective = "{objective}"\neffective_batch_size = 64\nmax_steps = 100\n'
        f'[preference]\nloss_type = "{loss}"\n'
    )
    return spec


def test_loss_type_enum_is_every_loss_a_preference_objective_plans(tmp_path):
    values = enum_of(KEYS["preference.loss_type"])
    assert values is not None and values[0] == "auto"
    assert not set(values) & set(NEEDS_LABEL_SMOOTHING)  # the plan refuses them (tests/plan/test_preference_plan.py)
    preference = [o for o in OBJECTIVES.values() if o.is_preference]
    for loss in values:  # each is planned by the objective that names it (auto: by every one)
        for o in [p for p in preference if loss == "auto" or loss in p.loss_types]:
            plan = plan_file(_dpo(tmp_path, o.name, loss), environment=ENV)
            assert plan.value("preference.loss_type") == (o.default_loss if loss == "auto" else loss)
        assert loss == "auto" or any(loss in p.loss_types for p in preference)
    for o in preference:  # a near miss is refused, with the hint the rule gives
        with pytest.raises(PlanError) as e:
            plan_file(_dpo(tmp_path, o.name, o.default_loss + "x"), environment=ENV)
        (d,) = [d for d in e.value.diagnostics if d.severity == "error"]
        assert d.key == "preference.loss_type" and f'did you mean "{o.default_loss}"' in d.summary
