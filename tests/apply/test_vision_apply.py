"""A tiny vision-language model fine-tuned for real on CPU through `gpuplan apply`, then asked about images it never saw.

The tiny Idefics3 of tests/helpers/vlm_base.py learns solid-colour images -> the colour's name with
LoRA on its language model (the vision tower and connector frozen, excluded from the targets) for 30
steps; the loss falls, the live run's audit agrees on what trains, the adapter holds no tower weight,
and after the run `gpuplan generate --image` names the colour of held-out images (other shades,
another size). Export writes a standalone model with its processor. Bad input is refused before
anything is written."""

from __future__ import annotations

import json

import pytest

from gpuplan.apply.errors import ApplyError
from tests.helpers.apply_plans import cpu_plan
from tests.helpers.cli_runs import gpuplan
from tests.helpers.vlm_base import COLOUR_SPEC, COLOURS, QUESTION, colour_rows, solid_image, vision_plan

pytest.importorskip("PIL")


def _plan(tmp_path, base, data, **extra):
    return cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": base,
            "model.from_scratch": False,
            "model.method": "lora",
            "lora.r": 8,
            "lora.lora_alpha": 16,
            "lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "data.train_files": [str(data)],
            "data.format": "chat",
            "data.packing": False,
            "data.seq_len": 56,
            "training.learning_rate": 3e-2,
            "training.max_steps": 30,
            "training.save_steps": 1000,
            "output.dir": str(tmp_path / "run"),
            **vision_plan(),
            **extra,
        },
    )


def _spec(tmp, base, data, steps=30):
    spec = tmp / "colours.toml"
    spec.write_text(COLOUR_SPEC.format(base=base, data_source=f'train_files = ["{data}"]', out=tmp / "run", steps=steps))
    return spec


@pytest.fixture(scope="module")
def colour_run(tmp_path_factory, tiny_vlm):
    """`gpuplan apply` of the colour task: planned, trained, audited, saved (~2 min on a busy 2-core machine)."""
    tmp = tmp_path_factory.mktemp("vlm-run")
    spec = _spec(tmp, tiny_vlm, colour_rows(tmp / "data"))
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp, json.loads((tmp / "run" / "gpuplan-state.json").read_text())["results"]


@pytest.mark.slow
def test_the_loss_falls_and_only_the_language_model_adapters_train(colour_run):
    from safetensors import safe_open

    tmp, results = colour_run
    assert results["train_loss_last"] < 0.5 * results["train_loss_first"], results
    checks = {c["key"]: c for stage in results["audit"]["checked"].values() for c in stage}
    assert not results["audit"]["differed"]
    assert checks["vision.frozen_modules"]["live"] == ["model.connector", "model.vision_model"]
    assert checks["data.collator"]["live"] == "ImageTextCollator"
    with safe_open(str(tmp / "run" / "final" / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all(".text_model." in n for n in names), names  # the tower's q_proj / v_proj are not targets
    assert results["trainable_params"] == results["plan_trainable_params"] == sum(_numel(tmp, n) for n in names)
    assert checks["vision.image_tokens"]["live"] == checks["vision.image_tokens"]["planned"] == 7
    assert (tmp / "run" / "final" / "processor_config.json").is_file()


def _numel(tmp, name):
    from safetensors import safe_open

    with safe_open(str(tmp / "run" / "final" / "adapter_model.safetensors"), "pt") as f:
        return f.get_tensor(name).numel()


@pytest.mark.slow
def test_generate_with_an_image_names_the_colour_of_held_out_images(colour_run):
    tmp, _ = colour_run
    for i, colour in enumerate(COLOURS):
        image = solid_image(tmp / "held-out" / f"{colour}.png", colour, size=24, jitter=12, seed=1000 + i)
        r = gpuplan("generate", tmp / "colours.toml", "--prompt", QUESTION, "--image", image, "--max-new-tokens", "8", "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        (g,) = json.loads(r.stdout)["generations"]
        assert g["completion"].strip() == colour, (colour, g)
        assert "<image>" in g["text"]


@pytest.mark.slow
def test_export_writes_a_standalone_model_with_its_processor(colour_run):
    tmp, _ = colour_run
    dest = tmp / "export"
    r = gpuplan("export", tmp / "colours.toml", "--to", dest)
    assert r.returncode == 0, r.stderr[-2000:]
    files = set(p.name for p in dest.iterdir())
    assert {"model.safetensors", "config.json", "processor_config.json", "chat_template.jinja", "tokenizer.json"} <= files
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(dest)
    assert type(model).__name__ == "Idefics3ForConditionalGeneration" and not any(".lora_" in n for n, _ in model.named_parameters())
    assert AutoProcessor.from_pretrained(dest).image_seq_len == 4


@pytest.mark.slow
def test_train_tower_puts_the_adapters_on_the_tower_too(tmp_path, tiny_vlm):
    from safetensors import safe_open

    spec = _spec(tmp_path, tiny_vlm, colour_rows(tmp_path / "data", per_colour=2), steps=2)
    spec.write_text(spec.read_text().replace("image_size = 32", "image_size = 32\ntrain_tower = true"))
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp_path / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())["results"]
    assert results["trainable_params"] == results["plan_trainable_params"]
    with safe_open(str(tmp_path / "run" / "final" / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(".vision_model." in n for n in names) and any(".text_model." in n for n in names)


@pytest.mark.slow
def test_a_full_fine_tune_trains_all_but_the_frozen_tower_as_planned(tmp_path, tiny_vlm):
    """The plan's trainable count leaves the frozen tower out, as apply freezes it (the audit compares them live)."""
    spec = _spec(tmp_path, tiny_vlm, colour_rows(tmp_path / "data", per_colour=2), steps=2)
    spec.write_text(spec.read_text().replace('method = "lora"', 'method = "full"'))
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp_path / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "gpuplan-state.json").read_text())["results"]
    assert results["trainable_params"] == results["plan_trainable_params"] < results.get("total_params", 10**12)


def _bad_data(tmp_path, image_bytes: bytes | None):
    data = colour_rows(tmp_path / "data", per_colour=1)
    target = tmp_path / "data" / "images" / "red-0.png"
    if image_bytes is None:
        target.unlink()
    else:
        target.write_bytes(image_bytes)
    return data


@pytest.mark.parametrize(
    ("image_bytes", "said"),
    [(None, "no such file"), (b"\x89PNG\r\n\x1a\nbroken", "cannot be decoded as an image")],
    ids=["missing", "corrupt"],
)
def test_a_missing_or_corrupt_image_is_refused_before_anything_is_written(tmp_path, tiny_vlm, image_bytes, said):
    from gpuplan.apply.train.execute import execute

    data = _bad_data(tmp_path, image_bytes)
    with pytest.raises(
        ApplyError, match=rf"data.train_files: 1 of 4 images in .*colours.jsonl cannot be used: 1 {said} \(row \d: images/red-0.png\)"
    ) as e:
        execute(_plan(tmp_path, tiny_vlm, data), echo=lambda s: None, progress=False)
    assert "relative to the data file" in e.value.diagnostics[0].fix
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("image_bytes", "said"), [(None, "no such file"), (b"GIF89a broken", "cannot be decoded as an image")], ids=["missing", "corrupt"]
)
def test_plan_and_apply_refuse_a_missing_or_corrupt_image(tmp_path, tiny_vlm, capsys, image_bytes, said):
    from gpuplan.cli.main import main

    spec = _spec(tmp_path, tiny_vlm, _bad_data(tmp_path, image_bytes))
    assert main(["apply", str(spec), "--yes"]) == 1
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert f"data.train_files[0]: 1 of 4 images in {tmp_path / 'data' / 'colours.jsonl'}: {said}" in text, text
    assert "Traceback" not in text
    assert not (tmp_path / "run").exists()


def test_generate_refuses_a_missing_image_before_loading_anything(tmp_path, capsys):
    from gpuplan.cli.main import main

    assert main(["generate", str(tmp_path / "run"), "--prompt", "hi", "--image", str(tmp_path / "nope.png")]) == 1
    err = capsys.readouterr().err
    assert "--image" in err and "no such file" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
