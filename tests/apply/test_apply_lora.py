"""LoRA and QLoRA apply, for real on CPU: a tiny Llama pretrained here, then adapter fine-tunes.

The base is trained from scratch and saved by execute() itself (lora_base.py); the
fine-tunes read other text. Checked: loss falls, the base files stay byte-identical, the
adapter file holds only adapter tensors, peft loads it back with the same logits, the
QLoRA base really is 4-bit (uint8 Params4bit), and refused settings say how to fix them.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

from gpuplan.apply.errors import ApplyError
from gpuplan.apply.train.execute import build_trainer, execute
from gpuplan.errors import GpuplanError
from tests.helpers.apply_plans import cpu_plan, read_jsonl
from tests.helpers.lora_base import file_hashes, finetune_overrides, other_text, pretrain_base

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

# q,k,v,o LoRA on the 2-layer base Llama (hidden 64, 4 heads, 2 KV heads of 16): r x (in + out)
# per target = 8x(64+64) + 8x(64+32) + 8x(64+32) + 8x(64+64) = 3,584 per layer.
ATTENTION_ADAPTER_PARAMS = 2 * 3_584


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora-base")
    return pretrain_base(tmp), other_text(tmp / "other.txt")


def _losses(output_dir) -> list[float]:
    return [r["loss"] for r in read_jsonl(os.path.join(output_dir, "metrics.jsonl")) if r["event"] == "train"]


def _falls(losses: list[float]) -> bool:
    """The mean of the last three logged losses is clearly below the first three (per-step noise ~0.05)."""
    return sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(seed))


@pytest.mark.slow
def test_lora_trains_only_the_adapter_and_saves_it_in_peft_format_with_the_merged_model(base, tmp_path):
    base_dir, text = base
    before = file_hashes(base_dir)
    plan = cpu_plan(tmp_path, **finetune_overrides(base_dir, text, "lora", **{"output.merge_adapter": True}))
    lines: list[str] = []
    results = execute(plan, echo=lines.append, progress=False)

    assert _falls(_losses(plan.value("output.dir"))), _losses(plan.value("output.dir"))
    assert file_hashes(base_dir) == before  # the frozen base is never written
    final = results["final_model_dir"]
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(os.listdir(final))
    assert "model.safetensors" not in os.listdir(final)  # the adapter only; merged/ holds the full model

    from safetensors.torch import load_file

    adapter = load_file(os.path.join(final, "adapter_model.safetensors"))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert sum(t.numel() for t in adapter.values()) == ATTENTION_ADAPTER_PARAMS == results["trainable_params"]
    assert results["method"] == "lora" and results["merged_model_dir"] == os.path.join(final, "merged")
    assert f"trainable: {ATTENTION_ADAPTER_PARAMS:,} parameters (lora adapters)" in lines
    assert any(line.startswith("final adapter: " + final) for line in lines)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    x = _tokens()
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(base_dir).eval()
        base_logits = plain(x).logits
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), final).eval()
        tuned_logits = tuned(x).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(results["merged_model_dir"]).eval()(x).logits
    assert not torch.allclose(tuned_logits, base_logits, atol=1e-2)  # the adapter does something
    torch.testing.assert_close(merged_logits, tuned_logits, atol=1e-4, rtol=1e-4)
    # only adapter weights changed: the base inside the loaded PeftModel is the saved base
    base_sd = plain.state_dict()
    for name, tensor in tuned.get_base_model().state_dict().items():
        if "lora_" not in name:
            torch.testing.assert_close(tensor, base_sd[name.replace(".base_layer", "")], atol=0, rtol=0)


@pytest.mark.slow
def test_qlora_base_is_4bit_and_the_reloaded_adapter_gives_the_trained_logits(base, tmp_path):
    base_dir, text = base
    before = file_hashes(base_dir)
    plan = cpu_plan(
        tmp_path,
        **finetune_overrides(
            base_dir,
            text,
            "qlora",
            **{
                "training.gradient_checkpointing": True,
                "training.max_steps": 8,
                "data.eval_fraction": 0.05,
                "training.eval_steps": 4,
                "quantization.bnb_4bit_compute_dtype": "bfloat16",
            },
        ),
    )  # what a CPU plan resolves
    prepared = build_trainer(plan, progress=False)
    model = prepared.model
    q_proj = model.get_base_model().model.layers[0].self_attn.q_proj
    import bitsandbytes as bnb

    assert isinstance(q_proj.base_layer, bnb.nn.Linear4bit)
    weight = q_proj.base_layer.weight
    assert type(weight).__name__ == "Params4bit" and weight.dtype == torch.uint8 and not weight.requires_grad
    assert weight.quant_state.quant_type == "nf4" and weight.quant_state.nested  # double quant
    # loaded in the compute dtype (issue 20 item 11): backward dequantizes to bf16, not to fp32 and a cast
    assert weight.quant_state.dtype == torch.bfloat16  # whatever model.dtype says (float32 in this plan)
    assert plan.value("model.dtype") == "float32"
    assert model.get_base_model().model.norm.weight.dtype == torch.float32  # prepare_model_for_kbit_training
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_A." in n or ".lora_B." in n
    }
    assert model.get_base_model().is_gradient_checkpointing  # and input grads on (adapters.wrap)

    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepared.trainer.train()  # evaluates at step 4, then trains on
    prepared.metrics.close()
    assert _falls(_losses(plan.value("output.dir"))), _losses(plan.value("output.dir"))
    # the evaluation did not repack the 4-bit weights for CPU inference (adapters.keep_training_layout):
    # without it the steps after step 4 backpropagate through gemv_4bit, which has no autograd kernel
    assert not [w for w in caught if "gemv_4bit" in str(w.message)]
    from gpuplan.apply.model.adapters import save_final

    final = str(tmp_path / "final")
    assert save_final(plan, prepared.trainer, final) is None  # no merge for a 4-bit base
    assert file_hashes(base_dir) == before

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from gpuplan.apply.model.adapters import keep_training_layout
    from gpuplan.apply.model.quant4 import quantization_config

    x = _tokens(1)
    with torch.no_grad():
        trained = model.eval()(x).logits
        fresh = AutoModelForCausalLM.from_pretrained(
            base_dir, quantization_config=quantization_config(plan), dtype=torch.bfloat16
        )  # as apply loads it
        keep_training_layout(fresh)  # the same 4-bit numerics as in training (fp32 absmax)
        for p in fresh.parameters():  # and the fp32 unquantized parts prepare_model_for_kbit_training made
            if p.dtype == torch.bfloat16:
                p.data = p.data.float()
        reloaded = PeftModel.from_pretrained(fresh, final).eval()(x).logits
    torch.testing.assert_close(reloaded, trained, atol=1e-5, rtol=1e-5)


def test_lora_from_scratch_is_refused_before_anything_is_written(tmp_path):
    plan = cpu_plan(tmp_path, **{"model.method": "lora"})
    with pytest.raises(ApplyError, match=r"model.method = 'lora'.*model.from_scratch = true.*model.method = \"full\""):
        execute(plan, echo=lambda s: None, progress=False)
    assert not os.path.exists(plan.value("output.dir"))


def test_merging_into_a_4bit_base_is_refused_with_the_fix(tmp_path):
    plan = cpu_plan(
        tmp_path,
        **{"model.method": "qlora", "model.from_scratch": False, "model.name_or_path": str(tmp_path), "output.merge_adapter": True},
    )
    with pytest.raises(ApplyError, match='output.merge_adapter = true with model.method = "qlora".*set output.merge_adapter = false'):
        execute(plan, echo=lambda s: None, progress=False)
    assert not os.path.exists(plan.value("output.dir"))


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("lora.r", 0, "lora.r = 0 must be a positive integer"),
        ("lora.lora_dropout", 1.5, r"lora.lora_dropout = 1.5 must be in \[0, 1\)"),
        ("lora.target_modules", [], "lora.target_modules = \\[\\] must name at least one module"),
        ("quantization.bnb_4bit_compute_dtype", "auto", "quantization.bnb_4bit_compute_dtype = 'auto' .* re-run"),
    ],
)
def test_bad_adapter_settings_name_the_key_and_write_nothing(tmp_path, key, value, message):
    plan = cpu_plan(tmp_path, **{"model.method": "qlora", "model.from_scratch": False, "model.name_or_path": str(tmp_path), key: value})
    with pytest.raises(ApplyError, match=message):
        execute(plan, echo=lambda s: None, progress=False)
    assert not os.path.exists(plan.value("output.dir"))


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("quantization.bnb_4bit_quant_type", "int4", "quantization.bnb_4bit_quant_type = 'int4' in the plan is not 'nf4' | 'fp4'"),
        ("model.method", "prefix", "model.method = 'prefix' in the plan is not 'full' | 'lora' | 'qlora'"),
    ],
)
def test_adapter_values_of_the_wrong_kind_are_refused_with_the_plan(tmp_path, key, value, message):
    """A value outside its closed set is refused when the Plan is built (plan/resolved.py), before apply starts."""
    with pytest.raises(GpuplanError, match=re.escape(message)) as e:
        cpu_plan(tmp_path, **{"model.method": "qlora", "model.from_scratch": False, "model.name_or_path": str(tmp_path), key: value})
    assert e.value.key == key
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_target_module_the_model_lacks_lists_the_names_it_has(base, tmp_path):
    base_dir, text = base
    plan = cpu_plan(tmp_path, **finetune_overrides(base_dir, text, "lora", **{"lora.target_modules": ["q_prj"]}))
    with pytest.raises(
        ApplyError,
        match=r"lora.target_modules = \['q_prj'\] does not fit this model.*"
        r"named: down_proj, gate_proj, .*q_proj",
    ):
        build_trainer(plan, progress=False)


@pytest.mark.slow
def test_gpuplan_apply_lora_end_to_end_resumes_the_adapter_and_refuses_a_new_rank(base, tmp_path):
    from tests.helpers.cli_runs import gpuplan, state, train_steps
    from tests.helpers.lora_base import adapter_spec

    base_dir, text = base
    out = tmp_path / "run"
    spec = adapter_spec(tmp_path / "lora.toml", base=base_dir, text=text, out=out, max_steps=6, merge=True)
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    s = state(out)
    planned = s["plan"]["model"]["trainable_params"]
    # q_proj 8x(64+64) + v_proj 8x(64+32) = 1,792 per layer, 2 layers: the plan counts what peft trains
    assert s["status"] == "completed" and planned == s["results"]["trainable_params"] == 3_584
    assert "trainable: 3,584 parameters (lora adapters; plan 3,584)" in r.stdout
    assert s["results"]["merged_model_dir"] == str(out / "final" / "merged")
    assert (out / "checkpoint-6" / "adapter_model.safetensors").is_file()
    assert not (out / "checkpoint-6" / "model.safetensors").exists()  # checkpoints hold the adapter only

    # a different rank would not load the adapter checkpoint: refused with the reason
    spec.write_text(spec.read_text().replace("r = 8", "r = 16"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1 and "lora.r: 8 -> 16 changes the adapter shapes" in r.stderr and "--restart" in r.stderr

    # more steps with the same adapter: resumes from the adapter checkpoint
    spec.write_text(spec.read_text().replace("r = 16", "r = 8").replace("max_steps = 6", "max_steps = 9"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    s = state(out)
    assert s["resumed_from"] == str(out / "checkpoint-6") and s["results"]["start_step"] == 6
    assert s["progress"]["global_step"] == 9 and train_steps(out) == list(range(1, 10))
    losses = _losses(out)
    assert _falls(losses), losses
    assert losses[6] < sum(losses[:3]) / 3 - 0.2, losses  # step 7 continues the trained adapter, not a fresh one


@pytest.mark.slow
def test_gpuplan_apply_qlora_end_to_end(base, tmp_path):
    from tests.helpers.cli_runs import gpuplan, state
    from tests.helpers.lora_base import adapter_spec

    base_dir, text = base
    out = tmp_path / "run"
    before = file_hashes(base_dir)
    spec = adapter_spec(tmp_path / "qlora.toml", base=base_dir, text=text, out=out, method="qlora", max_steps=6)
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    s = state(out)
    settings = {k: v["value"] for k, v in s["plan"]["settings"].items()}
    assert settings["model.method"] == "qlora" and settings["quantization.bnb_4bit_compute_dtype"] == "bfloat16"
    assert s["status"] == "completed" and s["results"]["trainable_params"] == 3_584
    assert s["results"]["merged_model_dir"] is None
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in (out / "final").iterdir()}
    assert _falls(_losses(out)), _losses(out)

    # more steps: resumes the adapter on the re-quantized base (the same 4-bit blocks)
    spec.write_text(spec.read_text().replace("max_steps = 6", "max_steps = 8"))
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 0, r.stderr
    s = state(out)
    assert s["resumed_from"] == str(out / "checkpoint-6") and s["progress"]["global_step"] == 8
    losses = _losses(out)
    assert len(losses) == 8 and losses[6] < sum(losses[:3]) / 3 - 0.2, losses  # the trained adapter continues
    assert file_hashes(base_dir) == before


@pytest.mark.slow
def test_two_process_ddp_lora_run_saves_one_adapter_and_one_merged_model(base, tmp_path):
    from tests.helpers.cli_runs import gpuplan, state
    from tests.helpers.lora_base import adapter_spec

    base_dir, text = base
    out = tmp_path / "run"
    spec = adapter_spec(tmp_path / "ddp.toml", base=base_dir, text=text, out=out, max_steps=4, merge=True)
    spec.write_text(spec.read_text().replace('gpu = "cpu"', 'gpu = "cpu"\ncount = 2'))
    r = gpuplan("apply", spec, "--yes", timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = state(out)
    assert s["status"] == "completed" and s["results"]["world_size"] == 2
    assert s["results"]["trainable_params"] == 3_584 and s["results"]["global_step"] == 4
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in (out / "final").iterdir()}
    assert (out / "final" / "merged" / "model.safetensors").is_file()


@pytest.mark.slow
def test_masked_lm_lora_adapter_loads_back_with_the_trained_logits(tmp_path):
    """masked-lm has no peft task type: a plain PeftModel, saved and loaded the same way."""
    from tests.helpers.apply_plans import MICRO_BERT, write_config

    config = write_config(tmp_path, dict(MICRO_BERT, initializer_range=0.2), "bert.json")
    (tmp_path / "pre").mkdir()
    pre = execute(
        cpu_plan(tmp_path / "pre", **{"model.config": config, "model.task": "masked-lm", "training.max_steps": 2, "data.seq_len": 32}),
        echo=lambda s: None,
        progress=False,
    )
    plan = cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": pre["final_model_dir"],
            "model.from_scratch": False,
            "model.task": "masked-lm",
            "model.method": "lora",
            "lora.target_modules": ["query", "value"],
            "data.seq_len": 32,
            "training.max_steps": 3,
        },
    )
    prepared = build_trainer(plan, progress=False)
    assert type(prepared.model).__name__ == "PeftModel"
    prepared.trainer.train()
    prepared.metrics.close()
    final = str(tmp_path / "final")
    prepared.trainer.save_model(final)

    from peft import PeftModel
    from transformers import AutoModelForMaskedLM

    x = _tokens(2)
    with torch.no_grad():
        trained = prepared.model.eval()(input_ids=x).logits
        loaded = PeftModel.from_pretrained(AutoModelForMaskedLM.from_pretrained(pre["final_model_dir"]), final)
        torch.testing.assert_close(loaded.eval()(input_ids=x).logits, trained, atol=1e-5, rtol=1e-5)
    lora_b = [p for n, p in prepared.model.named_parameters() if ".lora_B." in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # the adapter trained (B starts at zero)
