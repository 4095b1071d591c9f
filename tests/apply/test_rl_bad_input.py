"""A grpo run that cannot score or cannot run is refused before it writes anything: a reward that raises on the
first round's rows, a reward file or function gone since the plan was made, rows that lost the column a reward
reads or grew past rl.max_prompt_length, and a vLLM backend on a CPU. Each error names the key, the reward and
its file, and the fix; exit 1 and no traceback from the CLI; output.dir is never created."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

from gpuplan.apply.errors import ApplyError  # noqa: E402
from gpuplan.apply.train.execute import execute  # noqa: E402
from gpuplan.plan.build import plan_file  # noqa: E402
from gpuplan.plan.types import Plan, Setting  # noqa: E402
from tests.helpers.cli_runs import gpuplan  # noqa: E402
from tests.helpers.lora_base import pretrain_base  # noqa: E402
from tests.helpers.planning import ENV  # noqa: E402
from tests.helpers.rl_rows import arrow_rows, rl_spec, write_jsonl  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return pretrain_base(tmp_path_factory.mktemp("grpo-bad-base"), steps=1)


def _spec(tmp_path, base_dir, rows=None, **kw):
    data = write_jsonl(tmp_path / "prompts.jsonl", rows or arrow_rows(16))
    return rl_spec(tmp_path / "grpo.toml", base=base_dir, data=data, out=tmp_path / "run", **kw)


def _refused(plan, match: str) -> ApplyError:
    with pytest.raises(ApplyError, match=match) as e:
        execute(plan, echo=lambda s: None, progress=False)
    assert not os.path.exists(plan.resolved.output.dir)
    return e.value


@pytest.mark.slow
def test_a_reward_that_raises_on_the_first_batch_is_named_and_nothing_is_written(base, tmp_path):
    spec = _spec(tmp_path, base, rewards='[[rl.rewards]]\nkind = "function"\nfunction = "my_rewards.py:crashes"\n')
    r = gpuplan("apply", spec, "--yes")
    assert r.returncode == 1, r.stdout[-2000:]
    reward_file = tmp_path / "my_rewards.py"
    assert f"rl.rewards[0]: reward 'crashes' ({reward_file}) raised IndexError: list index out of range on the first batch" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run").exists()


def test_a_reward_file_or_function_gone_since_the_plan_is_refused_at_apply(base, tmp_path):
    plan = plan_file(_spec(tmp_path, base), environment=ENV)
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(rewards.read_text().replace("def lower(", "def lowercase("))
    e = _refused(
        plan, r"rl.rewards\[0\].function: .*my_rewards.py has no function 'lower' \(its functions: crashes, lowercase, needs_solution\)"
    )
    assert e.key == "rl.rewards[0].function" and e.fix.startswith("did you mean 'lowercase'?")
    rewards.unlink()
    _refused(plan, r"rl.rewards\[0\].function: the reward file .*my_rewards.py does not exist")


def test_rows_changed_since_the_plan_are_refused_at_apply(base, tmp_path):
    plan = plan_file(_spec(tmp_path, base), environment=ENV)
    rows = arrow_rows(16)
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": r["prompt"]} for r in rows])  # the answers are gone
    e = _refused(plan, r"rl.rewards\[1\] \(answer\) reads column 'answer', which the rows of .*prompts.jsonl do not have")
    assert e.key == "rl.rewards[1].column"
    rows[3]["prompt"] = "zig " * 40 + "-> 1 ="
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    too_long = r"1 of 16 prompts in .*prompts.jsonl are longer than rl.max_prompt_length = 24 tokens \(row 4; the longest has \d+\)"
    e = _refused(plan, too_long)
    assert e.fix.startswith("set rl.max_prompt_length = ")


def test_a_vllm_backend_on_a_cpu_plan_is_refused_not_replaced(base, tmp_path):
    """The planner refuses vLLM on a CPU; a plan edited by hand (or made by another version) is refused by apply
    with the reason, never run with transformers generation instead."""
    plan = plan_file(_spec(tmp_path, base), environment=ENV)
    settings = {
        **plan.settings,
        "rl.generation_backend": Setting("vllm-colocate", "user"),
        "rl.vllm_gpu_memory_utilization": Setting(0.3, "user"),
    }
    edited = Plan.from_dict(json.loads(json.dumps({**plan.to_dict(), "settings": {k: v.to_dict() for k, v in settings.items()}})))
    assert edited.resolved.rl.use_vllm
    e = _refused(edited, r"rl.generation_backend = 'vllm-colocate': vLLM runs only on GPUs")
    assert e.key == "rl.generation_backend" and 'rl.generation_backend = "transformers"' in e.fix
