"""GRPO and RLOO for real on CPU: the suite's tiny Llama pretrained here (tests/helpers/lora_base.py), then
trained by TRL 1.16's GRPOTrainer / RLOOTrainer with transformers generation on "words -> D =" prompts
(tests/helpers/rl_rows.py), scored by a user reward beside the spec (the share of lowercase letters that open
the completion) and the built-in exact-match against the rows' answer column. Planned by the real planner
from a spec; applied by execute() or the CLI."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

from gpuplan.apply.train.checkpoints import checkpoint_problem  # noqa: E402
from gpuplan.apply.train.execute import execute  # noqa: E402
from gpuplan.plan.build import plan_file  # noqa: E402
from tests.helpers.cli_runs import gpuplan, start, state, train_steps  # noqa: E402
from tests.helpers.lora_base import file_hashes, pretrain_base  # noqa: E402
from tests.helpers.planning import ENV  # noqa: E402
from tests.helpers.rl_rows import arrow_rows, rl_spec, write_jsonl  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpo-base")
    return pretrain_base(tmp), write_jsonl(tmp / "prompts.jsonl", arrow_rows())


def _train_lines(out) -> list[dict]:
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if r["event"] == "train"]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _plan(tmp_path, base, **kw):
    base_dir, data = base
    return plan_file(rl_spec(tmp_path / "grpo.toml", base=base_dir, data=data, out=tmp_path / "run", **kw), environment=ENV)


def _checked(results) -> dict[str, dict]:
    assert results["audit"]["differed"] == []
    return {c["key"]: c for stage in results["audit"]["checked"].values() for c in stage}


def _reward_rose(out, name: str = "lower") -> list[dict]:
    """The mean reward of the last steps is far above the first steps': 8 completions x 4 characters a step
    from a base that writes ~1 lowercase letter in 5 characters; no run that did not learn gets there."""
    lines = _train_lines(out)
    means = [r[f"rewards/{name}/mean"] for r in lines]
    assert _mean(means[-3:]) > _mean(means[:2]) + 0.35, means
    return lines


def test_grpo_full_fine_tune_raises_the_reward(base, tmp_path):
    plan = _plan(tmp_path, base, steps=6)
    rl = plan.resolved.rl
    assert (rl.num_generations, rl.generation_batch_size, rl.beta, rl.reference) == (4, 8, 0.0, "none")
    results = execute(plan, echo=lambda s: None, progress=False)
    lines = _reward_rose(plan.value("output.dir"))
    # TRL's names, per reward and for the run (render/run_metrics.py RL_METRICS)
    for key in ("rewards/lower/mean", "rewards/lower/std", "rewards/answer/mean", "reward", "reward_std", "completions/mean_length"):
        assert key in lines[-1], sorted(lines[-1])
    assert "clip_ratio/region_mean" in lines[-1] and "kl" not in lines[-1]  # beta 0: no KL term
    assert [r["step"] for r in lines] == list(range(1, 7)) and results["global_step"] == 6
    assert "model.safetensors" in os.listdir(results["final_model_dir"])
    checked = _checked(results)
    for key, want in {
        "training.objective": "GRPOTrainer",
        "rl.num_generations": 4,
        "rl.generation_backend": "transformers",
        "rl.reference": "none",
        "rl.loss_type": "dapo",
        "rl.logprob_temperature": 1.0,
        "rl.rewards": [["lower", 1.0], ["answer", 0.5]],
        "data.collator": "identity",
    }.items():
        assert checked[key]["live"] == want, checked[key]
    assert checked["rl.generation_batch_size"]["live"] == 8  # at train-begin: the loader's generation round
    r = gpuplan("show", tmp_path / "run")  # the reward sparkline per reward function
    assert r.returncode == 0, r.stderr[-2000:]
    assert "reward lower " in r.stdout and "completion length " in r.stdout


def test_grpo_lora_with_a_kl_term_raises_the_reward_and_leaves_the_base_untouched(base, tmp_path):
    base_dir, _ = base
    before = file_hashes(base_dir)
    spec = rl_spec(
        tmp_path / "grpo.toml", base=base_dir, data=base[1], out=tmp_path / "run", method="lora", lr="5e-2", steps=12, rl="beta = 0.04"
    )
    spec.write_text(spec.read_text() + "merge_adapter = true\n")  # [output] is the spec's last table
    plan = plan_file(spec, environment=ENV)
    assert plan.resolved.rl.reference == "adapters-off"
    results = execute(plan, echo=lambda s: None, progress=False)
    lines = _reward_rose(plan.value("output.dir"))
    assert all(r["kl"] >= 0 for r in lines) and any(r["kl"] > 0 for r in lines)  # the base, adapters off, is the reference
    assert file_hashes(base_dir) == before
    final = os.listdir(results["final_model_dir"])
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(final) and "model.safetensors" not in final
    assert "model.safetensors" in os.listdir(results["merged_model_dir"])  # output.merge_adapter, as for SFT
    checked = _checked(results)
    assert checked["rl.reference"]["live"] == "adapters-off" and checked["rl.adapters"]["live"] == ["default"]
    assert checked["rl.beta"]["live"] == 0.04
    g = gpuplan("generate", tmp_path / "grpo.toml", "--prompt", "zig zag tick -> 3 =", "--max-new-tokens", "4", "--json")
    assert g.returncode == 0, g.stderr[-2000:]
    assert json.loads(g.stdout)


def test_rloo_trains_against_trls_reference_copy(base, tmp_path):
    plan = _plan(tmp_path, base, objective="rloo", steps=3)
    rl = plan.resolved.rl
    assert rl.beta == 0.05 and rl.loss_type is None and rl.reference == "copy"  # RLOOConfig's beta, no loss_type
    results = execute(plan, echo=lambda s: None, progress=False)
    lines = _train_lines(plan.value("output.dir"))
    assert [r["step"] for r in lines] == [1, 2, 3] and "kl" in lines[-1] and "rewards/lower/mean" in lines[-1]
    checked = _checked(results)
    assert checked["training.objective"]["live"] == "RLOOTrainer"
    assert checked["rl.reference"]["live"] == "copy" and checked["rl.reference_frozen"]["live"] is True
    assert "rl.loss_type" not in checked


def test_a_grpo_run_resumes_after_sigkill_at_the_right_step(base, tmp_path):
    base_dir, data = base
    out = tmp_path / "run"
    spec = rl_spec(tmp_path / "grpo.toml", base=base_dir, data=data, out=out, steps=6, save_steps=2)
    proc = start("apply", spec, "--yes")
    deadline = time.monotonic() + 300
    while not [p for p in out.glob("checkpoint-*") if checkpoint_problem(str(p)) is None]:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it was killed"
    proc.kill()  # SIGKILL: no handler, no cleanup
    proc.wait()
    killed_at = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if checkpoint_problem(str(p)) is None)
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1 and "lock" in r.stderr and "Traceback" not in r.stderr  # the killed run's lock
    r = gpuplan("apply", spec, "--yes", "--break-lock", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = state(out)
    assert s["status"] == "completed" and s["resumed_from"] is not None
    assert s["results"]["start_step"] >= killed_at and s["progress"]["global_step"] == 6
    assert train_steps(out) == list(range(1, 7))  # no step lost or logged twice


def test_the_audit_reads_the_rl_settings_off_the_live_trainer(base, tmp_path):
    """Each RL check compares the plan with the live trainer, so a trainer that samples or scores otherwise than
    planned is caught (audit.py _rl_checks): changed on the built trainer here, as a library update could."""
    from gpuplan.apply.train import audit
    from gpuplan.apply.train.execute import build_trainer

    plan = _plan(tmp_path, base, steps=1, rl="temperature = 0.9")
    trainer = build_trainer(plan, progress=False).trainer
    checks, _ = audit.run_checks(plan, trainer, audit.BUILD)
    assert all(c.ok for c in checks) and {"rl.generation_config", "rl.logprob_temperature", "rl.rewards"} <= {c.key for c in checks}
    trainer.generation_config.temperature = 1.0  # sampling no longer at the planned temperature
    trainer.reward_weights[1] = 2.0
    bad = {c.key: c for c in audit.run_checks(plan, trainer, audit.BUILD)[0] if not c.ok}
    assert set(bad) == {"rl.generation_config", "rl.rewards"}
    assert bad["rl.generation_config"].planned == [4, True, 0.9, 1.0] and bad["rl.generation_config"].live == [4, True, 1.0, 1.0]
    assert bad["rl.rewards"].live == [["lower", 1.0], ["answer", 2.0]]
