"""Chunked cross-entropy for real (apply/model/chunked_loss.py): the same loss and gradients as
transformers' ForCausalLMLoss, the same losses step by step in real Trainer runs (plain and
packed text, chat with assistant-only masks, LoRA, FSDP and DDP over two gloo ranks), each chunk
recomputed in backward, and every family in the plan's list checked against its source.
"""

from __future__ import annotations

import copy
import inspect
import json

import pytest
import torch

from gpuplan.apply.model.chunked_loss import chunked_causal_lm_loss, install
from gpuplan.apply.train.execute import build_trainer
from gpuplan.plan.estimate.memory.loss_chunking import FAMILIES
from tests.helpers.apply_plans import CORPUS, MICRO_LLAMA, REPO, cpu_plan, read_jsonl
from tests.helpers.cli_runs import gpuplan

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]
LOSS_TOL = 1e-5  # relative, per step: float summation order only


def _micro_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in MICRO_LLAMA.items() if k != "model_type"}
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**cfg))


@pytest.mark.parametrize("items", [None, 29])
def test_chunked_loss_and_gradients_equal_for_causal_lm_loss(items):
    from transformers.loss.loss_utils import ForCausalLMLoss

    torch.manual_seed(1)
    hidden = torch.randn(2, 24, 32, requires_grad=True)
    head = torch.nn.Linear(32, 260, bias=False)
    labels = torch.randint(0, 260, (2, 24))
    labels[0, :7] = -100  # a masked prompt
    labels[1, 20:] = -100  # padding
    num = None if items is None else torch.tensor(items)
    ref = ForCausalLMLoss(head(hidden), labels, 260, num_items_in_batch=num)
    g_ref = torch.autograd.grad(ref, (hidden, head.weight))
    got = chunked_causal_lm_loss(hidden, labels, 260, num_items_in_batch=num, head=head, chunk=5)
    g_got = torch.autograd.grad(got, (hidden, head.weight))
    assert torch.allclose(got, ref, rtol=1e-6)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(g_got, g_ref))


def test_under_bf16_autocast_the_loss_matches_and_gradients_agree_to_bf16_rounding():
    plain = _micro_llama()
    chunked = copy.deepcopy(plain)
    install(chunked, 7)
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, got = plain(input_ids=x, labels=x).loss, chunked(input_ids=x, labels=x).loss
    ref.backward()
    got.backward()
    assert got.item() == pytest.approx(ref.item(), rel=1e-5)
    for p, q in zip(plain.parameters(), chunked.parameters()):  # bf16 has 8 bits of mantissa: ~0.4%
        assert (p.grad - q.grad).abs().max() <= 0.02 * p.grad.abs().max() + 1e-8


def test_each_chunk_runs_the_head_again_in_backward_and_no_full_logits_exist():
    model = _micro_llama()
    install(model, 16)
    calls, shapes = [], []

    def seen(module, args, out):
        calls.append(1)
        shapes.append(tuple(out.shape))

    model.lm_head.register_forward_hook(seen)
    x = torch.randint(0, 256, (2, 32))
    out = model(input_ids=x, labels=x)
    assert len(calls) == 4 and out.logits is None  # 64 tokens in 4 chunks; the full logits never exist
    out.loss.backward()
    assert len(calls) == 8 and set(shapes) == {(16, 260)}  # each chunk recomputed in backward
    assert model(input_ids=x).logits.shape == (2, 32, 260)  # no labels: the ordinary forward


def _forward_calls_head_then_loss(model_type: str) -> bool:
    """CausalLM.forward passes lm_head's output to self.loss_function with nothing in between."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cls = AutoModelForCausalLM._model_mapping[type(AutoConfig.for_model(model_type))]
    src = inspect.getsource(cls.forward)
    head, loss = src.find("self.lm_head("), src.find("self.loss_function(")
    between = src[head:loss]
    return 0 <= head < loss and "softcap" not in between and "logits = logits" not in between


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_listed_family_computes_its_loss_straight_from_lm_head(model_type):
    assert _forward_calls_head_then_loss(model_type)


def test_a_family_that_soft_caps_its_logits_is_not_listed():
    assert not _forward_calls_head_then_loss("gemma2") and "gemma2" not in FAMILIES


def _losses(prepared) -> list[float]:
    prepared.trainer.train()
    return [r["loss"] for r in prepared.trainer.state.log_history if "loss" in r]


def _run(tmp_path, name, **over):
    (tmp_path / name).mkdir(exist_ok=True)
    plan = cpu_plan(
        tmp_path / name, **{"training.max_steps": 4, "training.logging_steps": 1, "output.dir": str(tmp_path / name / "run"), **over}
    )
    return build_trainer(plan, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("packing", [True, False])
def test_trainer_run_with_chunked_loss_matches_the_standard_run_step_by_step(tmp_path, packing):
    over = {"data.packing": packing, "training.gradient_accumulation_steps": 2, "training.per_device_train_batch_size": 4}
    standard = _losses(_run(tmp_path, "standard", **over))
    chunked_run = _run(tmp_path, "chunked", **over, **{"training.loss_chunk_size": 48})
    assert chunked_run.model._gpuplan_loss_chunk_size == 48
    chunked = _losses(chunked_run)
    assert len(standard) == 4 and chunked == pytest.approx(standard, rel=LOSS_TOL)
    assert chunked[-1] < chunked[0]  # it learned, the same way


@pytest.mark.slow
def test_chat_with_assistant_only_masks_matches_the_standard_run(tmp_path):
    rows = read_jsonl(REPO / "specs" / "data" / "chat.jsonl")[:32]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    over = {
        "data.train_files": [str(path)],
        "data.format": "chat",
        "data.chat_template": "chatml",
        "data.seq_len": 128,
        "data.packing": False,
        "training.per_device_train_batch_size": 4,
        "training.effective_batch_size": 4,
    }
    standard = _losses(_run(tmp_path, "standard", **over))
    chunked_run = _run(tmp_path, "chunked", **over, **{"training.loss_chunk_size": 40})
    batch = next(iter(chunked_run.trainer.get_train_dataloader()))
    assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()  # prompts and padding masked
    chunked = _losses(chunked_run)
    assert chunked == pytest.approx(standard, rel=LOSS_TOL)


@pytest.mark.slow
def test_lora_with_chunked_loss_matches_the_standard_run(tmp_path):
    from tests.helpers.lora_base import finetune_overrides, other_text, pretrain_base

    (tmp_path / "base").mkdir()
    base = pretrain_base(tmp_path / "base", steps=2)
    over = finetune_overrides(base, other_text(tmp_path / "other.txt"), "lora", **{"training.max_steps": 4})
    standard = _losses(_run(tmp_path, "standard", **over))
    chunked_run = _run(tmp_path, "chunked", **over, **{"training.loss_chunk_size": 24})
    assert hasattr(chunked_run.model, "peft_config")  # installed through the PeftModel onto its base
    chunked = _losses(chunked_run)
    assert chunked == pytest.approx(standard, rel=LOSS_TOL)


def test_install_refuses_what_it_cannot_chunk():
    model = _micro_llama()
    with pytest.raises(ValueError, match=">= 1"):
        install(model, 0)
    from transformers import BertConfig, BertLMHeadModel

    bert = BertLMHeadModel(
        BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=100, is_decoder=True)
    )
    with pytest.raises(ValueError, match="'bert'"):
        install(bert, 8)
    assert copy.deepcopy(model).forward is not None


FSDP_SPEC = """
[model]
config = "{model}"
from_scratch = true
task = "causal-lm"

[hardware]
gpu = "cpu"
count = {count}

[data]
train_files = ["{corpus}"]
seq_len = 32

[training]
effective_batch_size = 8
per_device_train_batch_size = 2
max_steps = 3
lr_scheduler_type = "constant"
learning_rate = 3e-3
logging_steps = 1
save_steps = 1000
seed = 0
loss_chunk_size = {chunk}

[distributed]
strategy = "{strategy}"

[output]
dir = "{out}"
"""


def _apply(tmp_path, name, **kw):
    out = tmp_path / name
    spec = tmp_path / f"{name}.toml"
    spec.write_text(FSDP_SPEC.format(model=REPO / "specs" / "models" / "tiny-llama-cpu.json", corpus=CORPUS, out=out, **kw))
    r = gpuplan("apply", spec, "--yes", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    engine = json.loads((out / "gpuplan-state.json").read_text())["results"]["engine"]
    return engine, {m["step"]: m["loss"] for m in read_jsonl(out / "metrics.jsonl") if m["event"] == "train"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy, engine", [("fsdp", "fsdp2 full_shard"), ("ddp", "ddp")])
def test_two_cpu_ranks_with_chunked_loss_match_one_standard_process(tmp_path, strategy, engine):
    _, one = _apply(tmp_path, "one", count=1, strategy="none", chunk=0)
    measured, ranks = _apply(tmp_path, strategy, count=2, strategy=strategy, chunk=16)
    assert measured == engine  # read from the wrapped model, not a fallback
    assert sorted(ranks) == [1, 2, 3] and ranks == pytest.approx(one, abs=2e-3)
