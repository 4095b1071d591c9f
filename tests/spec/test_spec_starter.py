"""gpuplan init's starter spec: valid, plannable, every schema key present with a comment."""

import re
from pathlib import Path

import pytest
import tomllib

from gpuplan.hardware.catalog import lookup
from gpuplan.init.starter import ACTIVE, starter_spec
from gpuplan.plan.build import plan_file
from gpuplan.plan.types import PlanError
from gpuplan.spec.fmt import format_spec_text
from gpuplan.spec.schema import SECTIONS
from gpuplan.spec.validate import validate_spec
from tests.helpers.planning import ENV, MODELS

CASES = [  # model, --gpu as a user might type it, task, expected canonical GPU
    ("llama-3.1-8b", "a100 80gb", "causal-lm", "A100-80GB"),
    ("tiny-llama-cpu", "cpu", "causal-lm", "cpu"),
    ("gpt2", "T4", "causal-lm", "T4"),
    ("bert-base-uncased", "V100-16GB", "seq-cls", "V100-16GB"),
    ("roberta-base", "L4", "masked-lm", "L4"),
    ("qwen3-0.6b", "H100-80GB", "causal-lm", "H100-80GB"),
    ("phi-2", "rtx_4090", "causal-lm", "RTX-4090"),
    ("gemma-2b", "MI300X", "causal-lm", "MI300X"),
]


def _write(tmp_path: Path, model: str, gpu: str, task: str = "causal-lm") -> tuple[str, Path]:
    text = starter_spec(MODELS / f"{model}.json", gpu, task=task, spec_dir=tmp_path)
    path = tmp_path / f"{model}.toml"
    path.write_text(text)
    return text, path


@pytest.mark.parametrize("model,gpu,task,canonical", CASES)
def test_starter_validates_and_plans(tmp_path, model, gpu, task, canonical):
    text, path = _write(tmp_path, model, gpu, task)
    raw = tomllib.loads(text)
    spec = validate_spec(raw)
    assert spec.hardware.gpu == canonical
    assert spec.model.task == task
    plan = plan_file(path, environment=ENV)
    assert plan.memory.fits
    assert plan.value("model.config") == str((MODELS / f"{model}.json").resolve())
    assert plan.value("training.effective_batch_size") == raw["training"]["effective_batch_size"]


def test_auto_gpu_is_written_as_auto_and_plans_with_detection(tmp_path):
    text, path = _write(tmp_path, "opt-125m", "auto")
    assert tomllib.loads(text)["hardware"]["gpu"] == "auto"
    plan = plan_file(path, environment=ENV, detect=lambda: lookup("A10G"))
    assert plan.hardware.name == "A10G"


def test_every_schema_key_is_present_in_order_with_a_comment(tmp_path):
    text, _ = _write(tmp_path, "gpt2", "A100-80GB")
    lines = text.splitlines()
    headers = [ln for ln in lines if ln.startswith("[")]
    assert headers == [f"[{s}]" for s in SECTIONS]
    for section, model in SECTIONS.items():
        body = lines[lines.index(f"[{section}]") + 1 :]
        body = body[: next((i for i, ln in enumerate(body) if ln.startswith("[")), len(body))]
        keyed = [m for m in (re.match(r"^(# )?(\w+) = .*?\s+# (.+)$", ln) for ln in body) if m]
        assert [m.group(2) for m in keyed] == list(model.model_fields), section
        for m in keyed:
            active = m.group(1) is None
            assert active == (m.group(2) in ACTIVE[section]), f"{section}.{m.group(2)}"
            assert len(m.group(3)) > 10, f"{section}.{m.group(2)} has no real comment"


def test_comments_come_from_the_schema_descriptions(tmp_path):
    text, _ = _write(tmp_path, "gpt2", "T4")
    for section, model in SECTIONS.items():
        for key, info in model.model_fields.items():
            if info.description:
                assert info.description.rstrip(".") in text, f"{section}.{key}"


def test_each_commented_out_key_is_valid_when_uncommented(tmp_path):
    """The commented-out lines are real suggestions: uncommenting any one keeps the spec valid."""
    text, _ = _write(tmp_path, "bert-base-uncased", "A100-40GB", "seq-cls")
    lines = text.splitlines()
    uncommentable = [i for i, ln in enumerate(lines) if re.match(r"^# \w+ = ", ln)]
    assert len(uncommentable) >= 20
    for i in uncommentable:
        if lines[i].startswith("# config = "):  # model.config and model.name_or_path may not both be unset
            continue
        trial = lines[:i] + [lines[i][2:]] + lines[i + 1 :]
        validate_spec(tomllib.loads("\n".join(trial)))


def test_values_the_starter_chooses(tmp_path):
    gpt2 = tomllib.loads(_write(tmp_path, "gpt2", "T4")[0])
    assert gpt2["data"]["seq_len"] == 1024  # gpt2's n_positions
    assert gpt2["training"]["effective_batch_size"] == 128  # 2**17 tokens / 1024
    assert gpt2["model"]["dtype"] == "float32"
    llama = tomllib.loads(_write(tmp_path, "llama-3.1-8b", "A100-80GB")[0])
    assert llama["data"]["seq_len"] == 2048  # 131072 positions, capped
    assert llama["model"]["dtype"] == "bfloat16"  # 8B x 16 bytes does not fit 80 GB
    roberta = tomllib.loads(_write(tmp_path, "roberta-base", "T4")[0])
    assert roberta["data"]["seq_len"] == 512  # 514 positions, two of them padding offsets
    bert = tomllib.loads(_write(tmp_path, "bert-base-uncased", "T4", "seq-cls")[0])
    assert bert["model"]["num_labels"] == 2 and bert["data"]["label_field"] == "label"
    assert bert["training"]["effective_batch_size"] == 32
    for spec in (gpt2, llama, roberta, bert):
        assert spec["training"]["per_device_train_batch_size"] == "auto"
        assert spec["training"]["gradient_accumulation_steps"] == "auto"


def test_model_path_is_relative_to_the_spec_directory(tmp_path):
    spec_dir = tmp_path / "project" / "specs"
    spec_dir.mkdir(parents=True)
    model = tmp_path / "project" / "models" / "gpt2.json"
    model.parent.mkdir()
    model.write_text((MODELS / "gpt2.json").read_text())
    config = tomllib.loads(starter_spec(model, "T4", spec_dir=spec_dir))["model"]["config"]
    assert config == "../models/gpt2.json"
    config = tomllib.loads(starter_spec(MODELS / "gpt2.json", "T4", spec_dir=MODELS.parent))["model"]["config"]
    assert config == "models/gpt2.json"


def test_paths_sharing_only_the_root_stay_absolute(tmp_path):
    config = tomllib.loads(starter_spec(MODELS / "gpt2.json", "T4", spec_dir=Path("/")))["model"]["config"]
    assert config == (MODELS / "gpt2.json").resolve().as_posix()


def test_model_directory_becomes_name_or_path(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((MODELS / "gpt2.json").read_text())
    raw = tomllib.loads(starter_spec(model_dir, "T4", spec_dir=tmp_path))
    assert raw["model"] == {**raw["model"], "name_or_path": "my-model"}
    assert "config" not in raw["model"]
    validate_spec(raw)


def test_starter_is_already_formatted(tmp_path):
    text, _ = _write(tmp_path, "llama-3.1-8b", "H100-80GB")
    assert format_spec_text(text) == text


def test_unknown_and_ambiguous_gpu_errors_suggest_names(tmp_path):
    with pytest.raises(PlanError, match=r"unknown GPU 'A1000'.*Did you mean 'A100"):
        starter_spec(MODELS / "gpt2.json", "A1000", spec_dir=tmp_path)
    with pytest.raises(PlanError, match=r"ambiguous: it matches A100-40GB, A100-80GB"):
        starter_spec(MODELS / "gpt2.json", "a100", spec_dir=tmp_path)


def test_bad_model_config_and_task(tmp_path):
    with pytest.raises(PlanError, match="file not found"):
        starter_spec(tmp_path / "missing.json", "T4", spec_dir=tmp_path)
    with pytest.raises(PlanError, match="allowed: causal-lm, seq-cls, masked-lm"):
        starter_spec(MODELS / "gpt2.json", "T4", task="summarise", spec_dir=tmp_path)
