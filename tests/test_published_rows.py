"""The published rows as the fit plans them (benchmarks/published_rows.py): a GPTQ row's kernels are auto-gptq's."""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

from gpuplan.plan.estimate.step_time import shape as S
from tests.helpers.cli_runs import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import published_rows  # noqa: E402


def _kernels(out: dict) -> int:
    term = next(t for t in out["step_time"]["terms"] if t["name"] == "kernel launches")
    return int(re.match(r"([\d,]+) kernels", term["formula"]).group(1).replace(",", ""))


def test_a_gptq_row_launches_auto_gptqs_eager_dequantization_kernels_and_the_count_is_put_back():
    runs, _ = published_rows.usable_runs()
    gptq = next(r for r in runs if r.gptq and r.workload.gradient_checkpointing)
    as_bnb = dataclasses.replace(gptq, gptq=False)  # the same row planned as bitsandbytes NF4
    layers = gptq.facts.num_layers
    before = S.DEQUANT_KERNELS
    with_gptq, with_bnb = _kernels(published_rows.predict(gptq)), _kernels(published_rows.predict(as_bnb))
    assert S.DEQUANT_KERNELS == before  # predict() restores the plan's own count
    # bitsandbytes: DEQUANT_KERNELS per pass (3 under checkpointing) on Qwen's 5 linears a layer;
    # auto-gptq: 9 per forward on the same 5, forward and recomputed forward
    assert len(gptq.facts.first_layer_linears) == 5
    bnb_dequant = layers * S.DEQUANT_KERNELS * 3 * 5
    gptq_dequant = layers * published_rows.GPTQ_EAGER_KERNELS * 2 * 5
    assert gptq_dequant == layers * 90
    assert abs(with_gptq - (with_bnb - bnb_dequant + gptq_dequant)) <= 1  # int() of the plan's fractional count


def test_qwen_rows_are_planned_with_qwens_own_module_tree_and_the_lora_emb_rows_train_the_embeddings():
    """Qwen (v1) fuses q, k and v into c_attn: 5 linears and 8 tensors a layer (modeling_qwen.py), not Llama's 7 and 9.
    Its README's "LoRA (emb)" rows (base checkpoints) train wte and lm_head in full (finetune.py's modules_to_save)."""
    runs, _ = published_rows.usable_runs()
    readme = [r for r in runs if published_rows.source_name(r.row) == "QwenLM/Qwen"]  # ms-swift's rows train c_attn alone
    qwen7 = [r for r in readme if r.row["model"].startswith("Qwen/Qwen-7B") and r.workload.adapters is not None and not r.gptq]
    facts = qwen7[0].facts
    h, i, v, layers = 4096, 11008, 151936, 32  # Qwen-7B's config.json (intermediate: ffn_hidden_size / 2)
    per_block = 2 * h + (3 * h * h + 3 * h) + h * h + 3 * h * i  # ln_1, ln_2; c_attn with its bias; c_proj; w1, w2, c_proj
    assert facts.n_params == 2 * v * h + layers * per_block + h == 7_721_324_544  # wte, lm_head, ln_f
    assert [n.rsplit(".", 1)[1] for n, *_ in facts.linear_layers[:5]] == ["c_attn", "c_proj", "w1", "w2", "c_proj"]
    assert len(facts.param_shapes) == 8 * 32 + 3
    shapes = {r.row["model"]: S.build_shape(r.facts, r.workload, r.gpu, "bf16") for r in qwen7}
    chat, base = shapes["Qwen/Qwen-7B-Chat"], shapes["Qwen/Qwen-7B"]
    assert chat.adapters_per_layer == 5 and chat.trainable_tensors == 10 * 32
    assert base.saved_params == 2 * 151936 * 4096 and base.trainable_tensors == chat.trainable_tensors + 2
    assert next(r for r in qwen7 if r.row["model"] == "Qwen/Qwen-7B").workload.adapters.modules_to_save == ("wte", "lm_head")


def test_rows_checkpoint_in_the_form_their_framework_ran_and_predict_puts_the_plans_form_back():
    """transformers 4's Trainer (the Qwen README) and fsdp_qlora's --reentrant_checkpointing True ran the reentrant form;
    predict() plans a row with its form and leaves the plan's own (non-reentrant, as gpuplan's apply runs) in place."""
    runs, _ = published_rows.usable_runs()
    by_source = {}
    for r in runs:
        by_source.setdefault(published_rows.source_name(r.row), set()).add(r.reentrant)
    assert by_source["QwenLM/Qwen"] == {True} and by_source["AnswerDotAI/fsdp_qlora"] == {True}
    assert by_source["pytorch/torchtitan"] == {False}
    qwen = next(r for r in runs if r.reentrant and r.workload.gradient_checkpointing and r.workload.adapters is None)
    out = published_rows.predict(qwen)
    assert S.CHECKPOINT_MODE == "non-reentrant"
    term = next(t for t in out["step_time"]["terms"] if t["name"] == "checkpointing's host work")
    assert "reentrant)" in term["formula"] and "non-reentrant" not in term["formula"]
    layer, _ = S.CHECKPOINT_HOST_KERNELS["reentrant"]
    assert f"x ({layer:g})" in term["formula"]


def _swift(runs):
    return [r for r in runs if r.tokens_group is not None]


def test_rows_timed_in_samples_per_second_group_by_the_samples_they_train_and_the_rest_are_left_out_with_a_reason():
    """ms-swift publishes samples/s and deletes the samples over max_length: rows with one max_length, micro-batch 1 and the
    Qwen tokenizer train the same samples. Padded micro-batches, 8-bit bases and device_map splits are not plannable."""
    runs, left = published_rows.usable_runs()
    swift = _swift(runs)
    assert swift and {published_rows.source_name(r.row) for r in swift} == {"modelscope/ms-swift"}
    assert {r.tokens_group.max_length for r in swift} == {"512", "1024", "2048", "4096", "8192"}
    assert all(int(r.row["batch_size"]) == 1 and r.row["unit"] == "samples/s" for r in swift)
    # one tokenizer across Qwen (v1) sizes: 1.8B and 14B rows at 512 share a group
    at_512 = {r.row["model"] for r in swift if r.tokens_group.max_length == "512"}
    assert {"Qwen/Qwen-1_8B-Chat", "Qwen/Qwen-14B-Chat"} <= at_512
    why = {row["source_detail"]: reason for row, reason in left if "ms-swift" in row["source"]}
    assert any("bs 8" in d and "no tokens/s derivable" in w for d, w in why.items())  # padded to the longest: its own tokens
    assert any("int8 (gptq)" in d and "8-bit" in w for d, w in why.items())
    assert any("2*A100" in d and "device_map" in w for d, w in why.items())
    # the groups' rows are planned at fractions of max_length, not at max_length alone
    r = swift[0]
    assert [v.workload.seq_len for v in r.at_lengths] == [round(r.workload.seq_len * f) for f in published_rows.LENGTHS]


def test_a_group_measured_exactly_as_planned_at_some_tokens_per_sample_gives_that_length_and_no_error():
    """evaluate() finds a group's one tokens per sample: rows whose measured samples/s are the plan's own at 0.37 x
    max_length come back with 0.37 x max_length and errors of zero; moving one row's measurement moves its error only."""
    runs, _ = published_rows.usable_runs()
    group = [r for r in _swift(runs) if r.tokens_group.max_length == "1024"]
    assert len(group) >= 4
    tokens = 0.37 * 1024
    planned = [1 / published_rows._at(published_rows._seconds_per_sample(r), tokens) for r in group]
    as_planned = [dataclasses.replace(r, row={**r.row, "value": rate}) for r, rate in zip(group, planned)]
    errs, found = published_rows.evaluate(as_planned)
    assert found[group[0].tokens_group] == pytest.approx(tokens, rel=1e-3)
    assert max(map(abs, errs)) < 1e-3
    moved = list(as_planned)
    moved[0] = dataclasses.replace(moved[0], row={**moved[0].row, "value": planned[0] * 1.25})  # measured 25% faster
    errs, found = published_rows.evaluate(moved)
    assert found[group[0].tokens_group] == pytest.approx(tokens, rel=1e-3)  # the median row still sets the length
    assert errs[0] == pytest.approx(1 / 1.25 - 1, abs=1e-3) and max(map(abs, errs[1:])) < 1e-3


def test_a_groups_tokens_per_sample_never_exceeds_max_length():
    """A plan too slow for every row of a group cannot be rescued by more tokens than max_length: the samples kept are
    at most that long, so the error shows."""
    runs, _ = published_rows.usable_runs()
    group = [r for r in _swift(runs) if r.tokens_group.max_length == "512"]
    slow = [dataclasses.replace(r, row={**r.row, "value": float(r.row["value"]) / 10}) for r in group]
    errs, found = published_rows.evaluate(slow)
    assert found[group[0].tokens_group] == pytest.approx(512, rel=1e-3)
    assert min(errs) > 1  # the plan is faster than 10x-slowed measurements at any allowed length


def test_a_reported_error_takes_the_length_fitted_on_the_groups_other_rows():
    """Fitted on all of a group's rows, the length puts the middle row at 0 by construction; a report's errors
    (row_left_out) score each row at the length its group's other rows give, and a row the others agree on less than
    itself fares worse."""
    runs, _ = published_rows.usable_runs()
    group = [r for r in _swift(runs) if r.tokens_group.max_length == "512"]
    points = [published_rows._seconds_per_sample(r) for r in group]
    rates = [published_rows._samples_per_gpu(r) for r in group]
    fitted_on_all, _ = published_rows.evaluate(group)
    left_out, _ = published_rows.evaluate(group, row_left_out=True)
    for k in range(len(group)):
        others = published_rows._best_tokens(points[:k] + points[k + 1 :], rates[:k] + rates[k + 1 :], 512)
        assert left_out[k] == pytest.approx(1 / (published_rows._at(points[k], others) * rates[k]) - 1, rel=1e-9)
    k0 = min(range(len(group)), key=lambda k: abs(fitted_on_all[k]))
    assert abs(fitted_on_all[k0]) < 1e-3  # the row the all-row length was fitted through
    assert abs(left_out[k0] - fitted_on_all[k0]) > 1e-4  # ... scored at its group's other rows' length instead
    assert sum(map(abs, left_out)) > sum(map(abs, fitted_on_all))


def test_fms_acceleration_rows_are_planned_with_their_own_settings_and_their_tokens_per_second_is_per_gpu():
    """fms-acceleration's a100_80gb.csv (its HF Trainer's train_tokens_per_second, per process): 100 steps of packed
    4,096-token samples, so runtime x tokens/s is 100 x the micro-batch x 4,096 on every row; two GPUs ran FSDP
    FULL_SHARD through accelerate, one GPU a plain process."""
    runs, left = published_rows.usable_runs()
    fms = [r for r in runs if published_rows.source_name(r.row) == "foundation-model-stack/fms-acceleration"]
    assert not [row for row, _ in left if "fms-acceleration" in row["source"]]
    assert len(fms) == 13 and {r.row["method"] for r in fms} == {"full", "lora", "qlora"}
    for r in fms:
        runtime = float(re.search(r"train_runtime ([\d.]+) s", r.row["source_detail"]).group(1))
        assert runtime * r.row["derived_tokens_per_s_per_gpu"] == pytest.approx(100 * r.row["batch_size"] * 4096, rel=2e-3)
        assert r.workload.seq_len == 4096 and r.workload.gradient_checkpointing and r.hf_trainer and r.reentrant
        assert (r.workload.engine, r.workload.shard_world_size) == (("fsdp", 2) if r.count == 2 else ("none", 1))
        assert (r.workload.adapters is None) == (r.row["method"] == "full")
        if r.row["model"].startswith("mistralai/"):  # Llama's tree with Mistral's GQA: 8 key-value heads of 32
            assert (r.facts.num_layers, r.facts.intermediate_size, r.facts.num_key_value_heads) == (32, 14336, 8)


def test_fsdp_qlora_gathers_its_unquantized_parameters_in_bf16_and_predict_puts_the_rule_back():
    """fsdp_qlora's train.py quantizes without prepare_model_for_kbit_training: FSDP gathers the embeddings, norms and
    head in the bf16 they were loaded in, not the fp32 gpuplan's own QLoRA runs upcast them to."""
    from gpuplan.plan.estimate.comm_volumes import sharded_volumes
    from gpuplan.plan.estimate.memory import adapters_sharded as AS
    from gpuplan.plan.estimate.memory.adapters import adapter_layout

    runs, _ = published_rows.usable_runs()
    row = next(
        r
        for r in runs
        if "fsdp_qlora" in r.row["source"] and r.row["method"] == "qlora" and r.workload.engine == "fsdp" and r.workload.zero_stage == 3
    )
    assert row.workload.amp is None  # pure bf16: FSDP gathers in the stored dtype
    prepared = sharded_volumes(row.facts, row.workload)[0]
    before = AS.KBIT_UPCAST
    comm = published_rows.communication  # what predict plans the row's bytes with, under its source's rule
    seen = []
    published_rows.communication = lambda *a, **k: seen.append(AS.KBIT_UPCAST) or comm(*a, **k)
    try:
        published_rows._COMM.pop(id(row), None)
        published_rows.predict(row)
    finally:
        published_rows.communication = comm
    assert seen == [False] and AS.KBIT_UPCAST is before
    AS.KBIT_UPCAST = False
    try:
        unprepared = sharded_volumes(row.facts, row.workload)[0]
    finally:
        AS.KBIT_UPCAST = before
    # 2 bytes fewer per unquantized value (the adapters too: FSDP gathers them in the same param dtype), in the forward's
    # gather and the backward's, the tail (final norm, head) once
    f = row.facts
    adapters = adapter_layout(f, row.workload.adapters).adapter_params
    embed, tail = f.vocab_size * f.hidden_size, f.vocab_size * f.hidden_size + f.hidden_size
    assert prepared - unprepared == 2 * (2 * (embed + f.num_layers * 2 * f.hidden_size + adapters) + tail)
