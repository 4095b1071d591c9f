"""DPO and KTO for real on CPU: a tiny Llama pretrained here (tests/helpers/lora_base.py), then
preference-trained with TRL's trainers on pairs whose chosen answer repeats the prompt's words
and whose rejected answer does not (tests/helpers/preference_rows.py). Planned by the real
planner from a spec; applied by execute() or the CLI."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

from gpuplan.apply.errors import ApplyError  # noqa: E402
from gpuplan.apply.train.checkpoints import checkpoint_problem  # noqa: E402
from gpuplan.apply.train.execute import execute, samples_per_step  # noqa: E402
from gpuplan.plan.build import plan_file  # noqa: E402
from gpuplan.plan.types import PlanError  # noqa: E402
from tests.helpers.cli_runs import gpuplan, start, state, train_steps  # noqa: E402
from tests.helpers.lora_base import file_hashes, pretrain_base  # noqa: E402
from tests.helpers.planning import ENV  # noqa: E402
from tests.helpers.preference_rows import conversational, kto_rows, pairs, preference_spec, write_jsonl  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dpo-base")
    return pretrain_base(tmp), write_jsonl(tmp / "pairs.jsonl", pairs())


def _train_lines(out) -> list[dict]:
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if r["event"] == "train"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _learned_the_rule(out) -> list[dict]:
    lines = _train_lines(out)
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(lines[-1])
    acc = [r["rewards/accuracies"] for r in lines]
    margins = [r["rewards/margins"] for r in lines]
    assert _mean(acc[-4:]) > 0.9, acc
    assert _mean(margins[-4:]) > _mean(margins[:4]) + 0.5, margins  # the margins grow
    assert lines[-1]["rewards/chosen"] > lines[-1]["rewards/rejected"]
    return lines


def _plan(tmp_path, base_dir, data, **kw):
    return plan_file(preference_spec(tmp_path / "dpo.toml", base=base_dir, data=data, out=tmp_path / "run", **kw), environment=ENV)


def test_dpo_full_fine_tune_learns_the_rule(base, tmp_path):
    base_dir, data = base
    plan = _plan(tmp_path, base_dir, data)
    assert plan.value("preference.reference") == "copy"
    results = execute(plan, echo=lambda s: None, progress=False)
    _learned_the_rule(plan.value("output.dir"))
    assert "model.safetensors" in os.listdir(results["final_model_dir"])
    assert results["method"] == "full" and results["global_step"] == 16


def test_dpo_lora_learns_the_rule_and_leaves_the_base_untouched(base, tmp_path):
    base_dir, data = base
    before = file_hashes(base_dir)
    plan = _plan(tmp_path, base_dir, data, method="lora", lr="1e-2", extra="", steps=16)
    assert plan.value("preference.reference") == "adapters-off"
    results = execute(plan, echo=lambda s: None, progress=False)
    _learned_the_rule(plan.value("output.dir"))
    assert file_hashes(base_dir) == before  # the base files stay byte-identical
    final = os.listdir(results["final_model_dir"])
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(final) and "model.safetensors" not in final
    assert results["trainable_params"] == plan.model.trainable_params


def test_dpo_lora_against_a_separate_reference_model_uses_that_model(base, tmp_path):
    """preference.reference_model with LoRA: TRL gets that model as the reference (the plan counts it).
    The adapters start at zero, so against the base with adapters off the first step's rewards are 0;
    against a perturbed copy of the base they are not."""
    import torch
    from transformers import AutoModelForCausalLM

    base_dir, data = base
    ref_dir = tmp_path / "reference"
    ref = AutoModelForCausalLM.from_pretrained(base_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ref.save_pretrained(ref_dir)
    (tmp_path / "off").mkdir()
    plans = {
        "adapters-off": _plan(tmp_path / "off", base_dir, data, method="lora", steps=1),
        "model": _plan(tmp_path, base_dir, data, method="lora", steps=1, extra=f'[preference]\nreference_model = "{ref_dir}"\n'),
    }
    first = {}
    for want, plan in plans.items():
        assert plan.value("preference.reference") == want
        execute(plan, echo=lambda s: None, progress=False)
        first[want] = _train_lines(plan.value("output.dir"))[0]
    assert first["adapters-off"]["rewards/chosen"] == 0 and first["adapters-off"]["rewards/rejected"] == 0
    assert abs(first["model"]["rewards/chosen"]) > 1e-3 and abs(first["model"]["rewards/rejected"]) > 1e-3


def test_dpo_qlora_trains_the_adapters_on_a_4bit_base(base, tmp_path):
    base_dir, data = base
    plan = _plan(tmp_path, base_dir, data, method="qlora", lr="1e-2", steps=4)
    assert plan.value("preference.reference") == "adapters-off"
    results = execute(plan, echo=lambda s: None, progress=False)
    lines = _train_lines(plan.value("output.dir"))
    assert lines[-1]["rewards/margins"] > lines[0]["rewards/margins"]
    assert "adapter_model.safetensors" in os.listdir(results["final_model_dir"])


def test_dpo_on_conversational_pairs_with_the_chat_template(base, tmp_path):
    base_dir, _ = base
    data = write_jsonl(tmp_path / "chat.jsonl", conversational(pairs(16)))
    spec = preference_spec(tmp_path / "dpo.toml", base=base_dir, data=data, out=tmp_path / "run", steps=2)
    spec.write_text(spec.read_text().replace("seq_len = 48", 'seq_len = 96\nformat = "chat"\nchat_template = "chatml"'))
    r = gpuplan("data", spec, "--examples", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    shown = json.loads(r.stdout)
    kinds = [e["kind"] for e in shown["examples"]]
    assert kinds == ["chosen", "rejected"]
    chosen = shown["examples"][0]["segments"]
    assert "<|im_start|>assistant" in "".join(s["text"] for s in chosen if not s["trained"])  # the prompt is masked
    assert pairs(16)[0]["chosen"].strip() in "".join(s["text"] for s in chosen if s["trained"])
    results = execute(plan_file(spec, environment=ENV), echo=lambda s: None, progress=False)
    assert results["global_step"] == 2


def test_kto_trains(base, tmp_path):
    base_dir, _ = base
    data = write_jsonl(tmp_path / "kto.jsonl", kto_rows())
    plan = _plan(tmp_path, base_dir, data, objective="kto", steps=12)
    assert plan.value("preference.loss_type") == "kto"
    execute(plan, echo=lambda s: None, progress=False)
    lines = _train_lines(plan.value("output.dir"))
    assert _mean([r["loss"] for r in lines[-3:]]) < _mean([r["loss"] for r in lines[:3]]) - 0.05
    assert _mean([r["rewards/margins"] for r in lines[-3:]]) > 0.5


def test_bad_preference_data_is_refused_with_nothing_written(base, tmp_path):
    base_dir, _ = base
    rows = pairs(6)
    rows[2]["chosen"] = ""
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    spec = preference_spec(tmp_path / "dpo.toml", base=base_dir, data=data, out=tmp_path / "run")
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1
    assert f"1 of 6 dpo rows in {data} has an empty chosen (rows 2)" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()
    # a format the plan does not read (csv) is checked by apply, before anything is written
    csv = tmp_path / "bad.csv"
    csv.write_text("prompt,chosen,rejected\na ->, a.,b.\nb ->,, a.\n")
    plan = _plan(tmp_path, base_dir, str(csv))
    with pytest.raises(ApplyError, match=r"1 of 2 dpo rows in .*bad.csv has no chosen \(rows 1\)"):
        execute(plan, echo=lambda s: None, progress=False)
    assert not (tmp_path / "run").exists()
    with pytest.raises(PlanError, match="prompt longer than preference.max_prompt_length = 4 tokens"):
        plan_file(
            preference_spec(
                tmp_path / "dpo.toml", base=base_dir, data=base[1], out=tmp_path / "run", extra="[preference]\nmax_prompt_length = 4\n"
            ),
            environment=ENV,
        )


def test_a_dpo_run_resumes_after_sigkill_at_the_right_step(base, tmp_path):
    base_dir, data = base
    out = tmp_path / "run"
    spec = preference_spec(tmp_path / "dpo.toml", base=base_dir, data=data, out=out, steps=12, save_steps=2)
    proc = start("apply", spec, "--yes")
    deadline = time.monotonic() + 120
    while not [p for p in out.glob("checkpoint-*") if checkpoint_problem(str(p)) is None]:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it was killed"
    proc.kill()  # SIGKILL: no handler, no cleanup
    proc.wait()
    killed_at = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if checkpoint_problem(str(p)) is None)
    r = gpuplan("apply", spec, "--yes", "--break-lock")
    assert r.returncode == 0, r.stderr[-2000:]
    s = state(out)
    assert s["status"] == "completed" and s["resumed_from"] is not None
    assert s["results"]["start_step"] >= killed_at and s["progress"]["global_step"] == 12
    assert train_steps(out) == list(range(1, 13))  # no step lost or logged twice


def _live(plan):
    from gpuplan.apply.train.execute import build_trainer

    return build_trainer(plan, progress=False).trainer


@pytest.mark.parametrize("objective", ["dpo", "kto"])
def test_qlora_preference_adapters_train_in_fp32_as_planned(base, tmp_path, objective):
    """TRL casts a quantized base's trainable parameters to bf16 (trl/trainer/dpo_trainer.py,
    kto_trainer.py `__init__`); the plan prices fp32 adapters (as peft makes them for SFT), and that
    is what the built trainer's optimizer gets. This CPU plan has no bf16 at all (as on a T4): TRL
    cast to bf16 regardless of the plan's precision."""
    import torch

    base_dir, data = base
    if objective == "kto":
        data = write_jsonl(tmp_path / "kto.jsonl", kto_rows())
    plan = _plan(tmp_path, base_dir, data, method="qlora", objective=objective, steps=1)
    trainer = _live(plan)
    trainable = {n: p.dtype for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert set(trainable.values()) == {torch.float32}, trainable
    trainer.create_optimizer()
    assert {p.dtype for g in trainer.optimizer.param_groups for p in g["params"]} == {torch.float32}


def test_lora_dropout_runs_as_planned_under_dpo_and_the_base_dropout_stays_off(base, tmp_path):
    """TRL's disable_dropout (default True) zeroes every nn.Dropout (trl/trainer/utils.py
    disable_dropout_in_model), the adapters' too; the plan says lora.lora_dropout = 0.1 and prices it."""
    import torch

    base_dir, data = base
    spec = preference_spec(tmp_path / "dpo.toml", base=base_dir, data=data, out=tmp_path / "run", method="lora", steps=1)
    spec.write_text(spec.read_text().replace("r = 8\n", "r = 8\nlora_dropout = 0.1\n"))
    plan = plan_file(spec, environment=ENV)
    assert plan.value("lora.lora_dropout") == 0.1
    trainer = _live(plan)
    drops = {n: m.p for n, m in trainer.model.named_modules() if isinstance(m, torch.nn.Dropout)}
    adapter = {n: p for n, p in drops.items() if ".lora_dropout." in n}
    assert adapter and set(adapter.values()) == {0.1}, adapter
    assert {p for n, p in drops.items() if n not in adapter} <= {0}  # the base model's own dropout: TRL keeps it off


def test_a_full_fine_tunes_reference_copy_is_the_policy_so_the_first_rewards_are_zero(base, tmp_path):
    """fp32 weights under bf16 autocast: TRL builds the reference in the policy's dtype
    (trl/trainer/dpo_trainer.py: dtype=self.model.dtype); a pure-bf16 copy gave non-zero step-0 margins."""
    import torch

    base_dir, data = base
    plan = _plan(tmp_path, base_dir, data, steps=1, extra="bf16 = true\n")
    assert plan.value("training.bf16") is True and plan.value("model.dtype") == "float32"
    assert plan.value("preference.reference") == "copy"
    assert "in the policy's dtype" in next(c for c in plan.changes if c.key == "preference.reference").reason
    trainer = _live(plan)
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.float32}
    execute(plan, echo=lambda s: None, progress=False)
    first = _train_lines(plan.value("output.dir"))[0]
    assert first["rewards/chosen"] == 0 and first["rewards/rejected"] == 0 and first["rewards/margins"] == 0, first


def test_gpuplan_eval_of_a_dpo_run_points_at_the_dpo_eval_loss_the_run_logged(base, tmp_path):
    """gpuplan eval scores next-token loss (after/evaluate.py); a DPO run's eval loss is TRL's DPO loss
    against the reference, which the run's own eval steps log: refused with that reason, and the fix's
    file holds it."""
    base_dir, data = base
    spec = preference_spec(tmp_path / "dpo.toml", base=base_dir, data=data, out=tmp_path / "run", method="lora", steps=2)
    spec.write_text(spec.read_text().replace("seq_len = 48\n", "seq_len = 48\neval_fraction = 0.125\n"))
    assert gpuplan("apply", spec, "--yes").returncode == 0
    r = gpuplan("eval", spec)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert 'this run trained training.objective = "dpo", whose eval loss is TRL\'s dpo loss against the reference' in r.stderr
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert f'read the dpo eval loss TRL computed at the run\'s eval steps: the "eval" lines of {metrics}' in r.stderr
    evals = [e for e in map(json.loads, metrics.read_text().splitlines()) if e["event"] == "eval"]
    assert evals and {"eval_loss", "eval_rewards/margins"} <= set(evals[-1])  # TRL's DPO eval, logged by the run
    assert "evaluations" not in json.dumps(state(tmp_path / "run"))  # nothing recorded


def _kto_live(tmp_path, base_dir, data, seed, name, loss=""):
    spec = preference_spec(tmp_path / f"{name}.toml", base=base_dir, data=data, out=tmp_path / name, objective="kto", steps=2)
    text = spec.read_text().replace("seed = 0\n", f"seed = {seed}\n")
    spec.write_text(text + (f'\n[preference]\nloss_type = "{loss}"\n' if loss else ""))
    return _live(plan_file(spec, environment=ENV))


def _first_batches(trainer, n=2) -> list[list[list[int]]]:
    from transformers import set_seed

    # the Trainer seeds torch in __init__ (set_seed(args.seed)) and accelerate's seedable sampler reads
    # torch.random.initial_seed() when the dataloader is prepared: as in the trainer's own run, not the
    # seed of the trainer built last in this process
    set_seed(trainer.args.seed)
    it = iter(trainer.get_train_dataloader())
    return [next(it)["input_ids"].tolist() for _ in range(n)]


def test_kto_rows_are_shuffled_by_training_seed_and_keep_trls_kl_batches(base, tmp_path):
    """Issue 30: TRL 1.16's KTOTrainer reads its rows in order (KTOConfig train_sampling_strategy =
    "sequential", which kto_trainer.py `__init__` requires for a loss with a KL term: each KL completion is
    another example's of the same fixed batch), so training.seed changed nothing. gpuplan shuffles the rows
    with training.seed before TRL batches them: the live dataloader's first batches follow the seed, the
    sampler stays sequential and each batch's KL completions are still its own completions rotated."""
    from torch.utils.data import SequentialSampler

    base_dir, _ = base
    data = write_jsonl(tmp_path / "kto.jsonl", kto_rows())
    a = _kto_live(tmp_path, base_dir, data, 0, "a")
    b = _kto_live(tmp_path, base_dir, data, 1, "b")
    again = _kto_live(tmp_path, base_dir, data, 0, "again")
    assert _first_batches(a) == _first_batches(again)
    assert _first_batches(a) != _first_batches(b)
    assert isinstance(a._get_train_sampler(), SequentialSampler)
    size = a.args.per_device_train_batch_size
    rows = a.train_dataset
    assert size >= 2 and len(rows) == 64
    first = [rows[i]["prompt_ids"] + rows[i]["completion_ids"] for i in range(size)]
    with open(data) as f:
        in_order = [json.loads(r) for r in f]
    assert [r["label"] for r in in_order[:size]] != list(rows["label"][:size])  # not the file's order
    for at in range(0, len(rows) - size + 1, size):  # TRL's rotation within each batch (kto_trainer.py)
        block = rows[at : at + size]
        assert block["KL_completion_ids"] == [block["completion_ids"][-1], *block["completion_ids"][:-1]]
    # the dataloader reads those rows in that order: the first batch is the first `size` rows, padded
    batch = _first_batches(a, 1)[0]
    pad = a.processing_class.pad_token_id
    assert [[t for t in seq if t != pad] for seq in batch] == [[t for t in seq if t != pad] for seq in first]


def test_kto_apo_zero_unpaired_samples_at_random_with_the_seed(base, tmp_path):
    """apo_zero_unpaired has no KL term (kto_trainer.py calculate_kl): the Trainer's random sampler,
    seeded by training.seed, as for SFT; KTOConfig's default would have read the rows in order."""
    base_dir, _ = base
    data = write_jsonl(tmp_path / "kto.jsonl", kto_rows())
    a = _kto_live(tmp_path, base_dir, data, 0, "a", loss="apo_zero_unpaired")
    b = _kto_live(tmp_path, base_dir, data, 1, "b", loss="apo_zero_unpaired")
    again = _kto_live(tmp_path, base_dir, data, 0, "again", loss="apo_zero_unpaired")
    assert a.args.train_sampling_strategy == "random"
    assert _first_batches(a) == _first_batches(again) and _first_batches(a) != _first_batches(b)


def test_kto_on_paired_rows_trains_on_both_completions_of_each_pair(base, tmp_path):
    """TRL's KTOTrainer unpairs prompt / chosen / rejected rows (trl/trainer/kto_trainer.py _prepare_dataset,
    trl/data_utils.py unpair_preference_dataset): the plan accepts them and says so, apply trains on 2N
    labelled completions, and the shuffled batches hold both labels (unpaired in order, the first 32 rows
    would be the 32 chosen completions)."""
    base_dir, data = base  # 64 pairs
    spec = preference_spec(tmp_path / "kto.toml", base=base_dir, data=data, out=tmp_path / "run", objective="kto", steps=2)
    plan = plan_file(spec, environment=ENV)
    assert any("64 rows" in d.summary and "128 labelled completions" in d.summary for d in plan.diagnostics if d.severity == "note")
    trainer = _live(plan)
    assert len(trainer.train_dataset) == 128 and sum(trainer.train_dataset["label"]) == 64
    size = trainer.args.per_device_train_batch_size
    assert len(set(trainer.train_dataset["label"][:size])) == 2
    from gpuplan.apply.data.preview import preview

    shown = preview(plan, 2)  # `gpuplan data`: each pair's two completions, by file row
    assert [(e["row"], e["kind"]) for e in shown["examples"]] == [
        (0, "desirable"),
        (0, "undesirable"),
        (1, "desirable"),
        (1, "undesirable"),
    ]
    assert shown["stats"]["rows"] == 64 and shown["stats"]["examples"] == 128
    results = execute(plan, echo=lambda s: None, progress=False)
    assert results["global_step"] == 2


def test_dpo_under_fsdp_on_two_cpu_ranks_shards_the_policy_and_the_reference(base, tmp_path):
    """accelerate drops the FSDP plugin on CPU ranks (accelerate/state.py: FSDP only for the MULTI_GPU-like
    types; gpuplan/apply/train/fsdp_cpu.py) and TRL's DPOTrainer inherits the Trainer's accelerator set-up, so
    built as TRL ships it a CPU fsdp dpo run trained under DDP (the audit stopped it: planned 'fsdp2
    full_shard', live 'ddp'). Two ranks over gloo: the policy and TRL's reference copy are fully_shard
    units (checked on the live modules by the audit on every rank), and the losses are one process's."""
    base_dir, data = base
    (tmp_path / "one").mkdir()
    one = _plan(tmp_path / "one", base_dir, data, steps=2)
    execute(one, echo=lambda s: None, progress=False)
    reference = {r["step"]: r["loss"] for r in _train_lines(one.value("output.dir"))}

    out = tmp_path / "run"
    spec = preference_spec(tmp_path / "fsdp.toml", base=base_dir, data=data, out=out, steps=2)
    text = spec.read_text().replace('gpu = "cpu"', 'gpu = "cpu"\ncount = 2')
    spec.write_text(text.replace("[output]", '[distributed]\nstrategy = "fsdp"\n\n[output]'))
    r = gpuplan("apply", spec, "--yes", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "--nproc_per_node=2" in r.stdout
    res = state(out)["results"]
    assert res["world_size"] == 2 and res["engine"] == "fsdp2 full_shard" and res["fsdp_units"] > 1
    checked = {c["key"]: c for stage in res["audit"]["checked"].values() for c in stage}
    for key in ("distributed.strategy", "preference.reference_engine"):  # the policy's and the reference's wrapping
        assert checked[key] == {"key": key, "planned": "fsdp2 full_shard", "live": "fsdp2 full_shard", "ok": True}
    assert checked["preference.reference"]["live"] == "copy"
    assert res["audit"]["differed"] == []
    # each rank's mean DPO loss over its half of the batch, averaged: the one-process loss of the 8 pairs
    fsdp = {r["step"]: r["loss"] for r in _train_lines(out)}
    assert sorted(fsdp) == [1, 2]
    assert fsdp == pytest.approx(reference, abs=2e-3)
    assert fsdp[1] == pytest.approx(0.6931, abs=1e-4)  # the reference is the policy at the start


def test_the_plan_prices_the_padded_width_trls_collator_builds(base, tmp_path):
    """TRL pads each micro-batch to its longest sequence (trl/trainer/dpo_trainer.py DataCollatorForPreference,
    after appending the EOS to each answer, add_eos): the plan's expected padded length, counted with the
    base's tokenizer.json (plan/inputs/preference_lengths.py), against the widths of the live trainer's batches."""
    import math

    from gpuplan.plan.inputs.preference_lengths import example_lengths

    base_dir, data = base
    plan = _plan(tmp_path, base_dir, data, steps=2)
    b = plan.value("training.per_device_train_batch_size")
    values = {k: plan.value(k) for k in ("training.objective", "data.train_files", "preference.max_length", "data.format")}
    lengths = example_lengths(values, str(tmp_path), source=base_dir, from_scratch=False)
    from gpuplan.apply.train.execute import build_trainer

    prepared = build_trainer(plan, progress=False)
    trainer = prepared.trainer
    # the run's tokens/s counts the tokens the plan expects the batches to carry (apply/train/metrics.py)
    assert prepared.metrics.tokens_per_step == plan.throughput.tokens_per_step
    live = sorted(max(len(r["prompt_ids"]) + len(r[k]) for k in ("chosen_ids", "rejected_ids")) for r in trainer.train_dataset)
    assert list(lengths.lengths) == live  # every example's longest sequence, token for token
    expected = lengths.expected_longest(b)
    assert plan.throughput.tokens_per_step == samples_per_step(plan) * 2 * math.ceil(expected) < samples_per_step(plan) * 2 * 48
    widths = [batch["input_ids"].shape[1] for _ in range(4) for batch in trainer.get_train_dataloader()]
    assert max(widths) <= 48 and sum(widths) / len(widths) == pytest.approx(expected, abs=1.0)  # 4 epochs' batches


def test_a_reference_left_whole_under_a_planned_fsdp_is_caught(base, tmp_path):
    """The plan counts TRL's reference as fully_shard-ed with the policy under FSDP (memory/preference.py
    reference_bytes); the audit holds the live reference to that. A real DPOTrainer built in one process
    keeps its reference copy whole: audited against the two-rank FSDP plan of the same spec, the check
    names it (the two-rank run with the promotion is test_dpo_under_fsdp_on_two_cpu_ranks...)."""
    from gpuplan.apply.train import audit

    base_dir, data = base
    one = _plan(tmp_path, base_dir, data, steps=1)
    trainer = _live(one)
    spec = preference_spec(tmp_path / "fsdp.toml", base=base_dir, data=data, out=tmp_path / "run2", steps=1)
    text = spec.read_text().replace('gpu = "cpu"', 'gpu = "cpu"\ncount = 2')
    spec.write_text(text.replace("[output]", '[distributed]\nstrategy = "fsdp"\n\n[output]'))
    fsdp_plan = plan_file(spec, environment=ENV)
    checks, _ = audit.run_checks(fsdp_plan, trainer, audit.BUILD)
    (ref,) = [c for c in checks if c.key == "preference.reference_engine"]
    assert (ref.planned, ref.live, ref.ok) == ("fsdp2 full_shard", "none", False)
    # and the one-process plan has no such check: nothing is sharded there
    assert "preference.reference_engine" not in {c.key for c in audit.run_checks(one, trainer, audit.BUILD)[0]}
