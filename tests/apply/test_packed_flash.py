"""Packed chat data under flash_attention_2: a micro-batch of B blocks reaches the model as one row.

transformers 5.24 gives flash-attn the per-example sequence bounds (cu_seqlens from the
position ids) only for a one-row batch; B rows of packed examples would attend to each
other. flash-attn does not run on CPU, so the flash side is checked with transformers'
own functions that decide the varlen path, and the flattened row is run for real under
SDPA, whose mask is built from the same position ids.
"""

from __future__ import annotations

import json

from gpuplan.apply.data.chat import IGNORE_INDEX
from gpuplan.apply.data.prepare import prepare_data
from gpuplan.apply.data.tokenizer import byte_level_tokenizer
from tests.helpers.apply_plans import MICRO_LLAMA, cpu_plan
from tests.helpers.planning import plan_text, spec

ROWS = [{"messages": [{"role": "user", "content": f"Add {i} and {i}."}, {"role": "assistant", "content": f"{2 * i}."}]} for i in range(6)]


def _data(tmp_path, attn):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    plan = cpu_plan(
        tmp_path,
        **{
            "data.train_files": [str(path)],
            "data.format": "chat",
            "data.chat_template": "chatml",
            "data.seq_len": 160,
            "data.packing": True,
            "model.attn_implementation": attn,
        },
    )
    return prepare_data(plan, byte_level_tokenizer())


def test_flash_packed_micro_batch_is_one_row_with_each_examples_bounds(tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

    data = _data(tmp_path, "flash_attention_2")
    assert len(data.train) >= 2
    rows = [data.train[0], data.train[1]]
    batch = data.collator(rows)
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    assert tuple(batch["input_ids"].shape) == (1, 320)  # two 160-token blocks in one row
    pos = batch["position_ids"]
    assert _is_packed_sequence(pos, batch_size=pos.shape[0])  # the test transformers runs before varlen flash
    starts = [i for i, p in enumerate(pos[0].tolist()) if p == 0]
    (cu_q, _), _ = prepare_fa_kwargs_from_position_ids(pos)
    assert cu_q.tolist() == starts + [320]  # one flash sequence per example (and per padding tail)
    assert all(batch["labels"][0, s].item() == IGNORE_INDEX for s in starts)
    # Each example of the row sees only itself: a real forward (SDPA builds its mask from the same
    # position ids) of the flattened row against each example alone.
    cfg = dict(MICRO_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    real = [(a, b) for a, b in zip(starts, starts[1:] + [320]) if batch["labels"][0, a:b].ne(IGNORE_INDEX).any()]
    assert len(real) >= 3
    with torch.no_grad():
        row = model(input_ids=batch["input_ids"], position_ids=pos, use_cache=False).logits[0]
        for a, b in real:
            alone = model(input_ids=batch["input_ids"][:, a:b]).logits[0]
            torch.testing.assert_close(row[a:b], alone, atol=1e-5, rtol=1e-4)


def test_sdpa_packed_micro_batch_keeps_its_rows(tmp_path):
    data = _data(tmp_path, "sdpa")  # SDPA isolates examples row by row: no (1, 1, BS, BS) mask
    batch = data.collator([data.train[0], data.train[1]])
    assert tuple(batch["input_ids"].shape) == (2, 160)


def test_plan_says_flash_attention_packs_a_micro_batch_into_one_row(tmp_path):
    rows = tmp_path / "c.jsonl"
    rows.write_text(json.dumps(ROWS[0]) + "\n")
    plan = plan_text(
        tmp_path,
        spec(
            model="tiny-llama-cpu",
            gpu="A100-80GB",
            extra='attn_implementation = "flash_attention_2"\ndtype = "bfloat16"',
            data=f'seq_len = 512\nformat = "chat"\nchat_template = "chatml"\ntrain_files = ["{rows}"]',
            training="effective_batch_size = 16\nper_device_train_batch_size = 4",
        ),
    )
    assert plan.value("model.attn_implementation") == "flash_attention_2"
    assert plan.value("training.per_device_train_batch_size") == 4
    reason = plan.settings["data.packing"].reason
    assert "laid end to end in one row" in reason and "varlen" in reason
    assert "attends within each example only" not in reason


def test_flattened_micro_batch_has_the_loss_of_its_rows(tmp_path):
    """The loss the Trainer sees is unchanged by the flattening: same tokens, same labels, same mean."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, default_data_collator

    data = _data(tmp_path, "flash_attention_2")
    rows = [data.train[i] for i in range(min(3, len(data.train)))]
    cfg = dict(MICRO_LLAMA)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg), attn_implementation="sdpa").eval()
    with torch.no_grad():
        flat = model(**data.collator(rows), use_cache=False).loss
        by_rows = model(**default_data_collator(rows), use_cache=False).loss
    torch.testing.assert_close(flat, by_rows, atol=1e-5, rtol=1e-5)
