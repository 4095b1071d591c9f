"""generate, eval and export on adapter runs: LoRA and QLoRA on a tiny pretrained Llama, trained by the CLI.

Checked: the export of a LoRA run is a plain transformers model with the logits of the
adapter on its base; the QLoRA export is merged into a 16-bit copy of the base (no 4-bit
weights); generate loads the adapter on the base the state recorded and refuses a base
whose files changed since; eval asks for data when the run held none out.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.helpers.after_runs import tree
from tests.helpers.cli_runs import gpuplan
from tests.helpers.lora_base import adapter_spec, other_text, pretrain_base

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("after-lora")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUPLAN_CALIBRATION_FILE", str(tmp / "cal.jsonl"))
        trained = pretrain_base(tmp)
    base_dir = tmp / "base"
    shutil.copytree(trained, base_dir)  # a base of this module's own, which one test changes and restores
    return tmp, str(base_dir), other_text(tmp / "other.txt")


def _apply(tmp, base_dir, text, method: str):
    spec = adapter_spec(tmp / f"{method}.toml", base=base_dir, text=text, out=tmp / f"run-{method}", method=method, max_steps=4)
    r = gpuplan("apply", spec, "--yes", GPUPLAN_CALIBRATION_FILE=str(tmp / "cal.jsonl"))
    assert r.returncode == 0, r.stderr[-3000:]
    return spec, tmp / f"run-{method}"


@pytest.fixture(scope="module")
def lora(base):
    return _apply(*base, "lora")


def _tokens():
    import torch

    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def test_export_of_a_lora_run_gives_the_logits_of_the_adapter_on_the_base(base, lora, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, base_dir, _ = base
    spec, out = lora
    dest = tmp_path / "merged"
    r = gpuplan("export", spec, "--to", dest)
    assert r.returncode == 0, r.stderr[-2000:]
    files = set(os.listdir(dest))
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= files and "adapter_config.json" not in files
    info = json.loads((dest / "gpuplan-export.json").read_text())
    assert info["method"] == "lora" and info["dtype"] == "float32" and str(out / "final") in info["source"]
    for line in (
        f"vllm serve {dest} --dtype float32 --max-model-len 32",
        "text-generation-inference",
        f"pipeline('text-generation', model='{dest}')",
        "Inference memory for one sequence of 32 tokens",
    ):
        assert line in r.stdout
    x = _tokens()
    with torch.no_grad():
        exported = AutoModelForCausalLM.from_pretrained(dest).eval()(x).logits  # transformers alone
        adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), out / "final").eval()(x).logits
        plain = AutoModelForCausalLM.from_pretrained(base_dir).eval()(x).logits
    assert not torch.allclose(adapter, plain, atol=1e-3)  # the adapter changes the model
    torch.testing.assert_close(exported, adapter, atol=1e-5, rtol=1e-5)


def test_generate_loads_the_adapter_on_the_recorded_base(base, lora):
    _, base_dir, _ = base
    spec, out = lora
    r = gpuplan("generate", spec, "--prompt", "ping ", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"loaded adapter {out / 'final'} on the base {base_dir} on cpu" in r.stderr
    assert json.loads(r.stdout)["generations"][0]["new_tokens"] > 0


def _main(args, capsys):
    from gpuplan.cli.main import main

    env = dict(os.environ)
    try:
        code = main([str(a) for a in args])
    finally:
        os.environ.clear()
        os.environ.update(env)
    return code, capsys.readouterr().err


def test_a_changed_base_is_refused(base, lora, tmp_path, capsys):
    _, base_dir, _ = base
    spec, out = lora
    weights = os.path.join(base_dir, "model.safetensors")
    original = open(weights, "rb").read()
    changed = bytearray(original)
    changed[-1] ^= 1
    before = tree(out)
    try:
        with open(weights, "wb") as f:
            f.write(changed)
        for args in (
            ("generate", spec, "--prompt", "x"),
            ("chat", spec),
            ("eval", spec, "--data", base[2]),
            ("export", spec, "--to", tmp_path / "e"),
        ):
            code, err = _main(args, capsys)
            assert code == 1 and "changed since the run trained its adapter on it: model.safetensors changed" in err
    finally:
        with open(weights, "wb") as f:
            f.write(original)
    assert tree(out) == before and not (tmp_path / "e").exists()


def test_eval_asks_for_data_when_the_run_held_none_out(base, lora, capsys):
    spec, out = lora
    before = tree(out)
    code, err = _main(("eval", spec), capsys)
    assert code == 1 and "held out no eval data" in err and f"gpuplan eval {spec} --data FILE" in err
    assert tree(out) == before
    r = gpuplan("eval", spec, "--data", base[2], "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["eval_loss"] > 0


def test_qlora_export_merges_into_a_16_bit_copy_of_the_base(base, tmp_path):
    pytest.importorskip("bitsandbytes")
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    spec, out = _apply(*base, "qlora")
    dest = tmp_path / "qlora-merged"
    r = gpuplan("export", spec, "--to", dest)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "merged into " + base[1] + " (bfloat16)" in r.stdout  # compute dtype float32 on CPU: bfloat16
    weights = load_file(dest / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}  # no uint8 4-bit blocks, no absmax
    assert not any("absmax" in k or "quant" in k for k in weights)
    model = AutoModelForCausalLM.from_pretrained(dest)
    assert model(_tokens()).logits.isfinite().all()
    g = gpuplan("generate", spec, "--prompt", "ping ", "--max-new-tokens", "4")
    assert g.returncode == 0 and "on the base " + base[1] + " (4-bit, as trained) on cpu" in g.stderr, g.stderr[-2000:]
