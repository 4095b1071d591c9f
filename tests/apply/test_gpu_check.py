"""benchmarks/gpu_check.py: its CPU mode trains a real tiny case through apply, and its GPU table renders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402

from tests.helpers.cli_runs import env, run  # noqa: E402

# The script and each case it runs in a process of its own (`gpu_check.py --run-case`) are forked from the
# worker's pre-imported fork server (tests/helpers/forked.py, boot/sitecustomize.py): real processes
# running the real script, without 9 s of imports each.


def test_matrix_crosses_methods_families_precisions_and_checkpointing():
    rows = gpu_check.matrix(["llama", "gpt2", "gpt_neox"], ["full"], ["fp16", "bf16"])
    assert len(rows) == 12 and {(r["precision"], r["ckpt"]) for r in rows} == {
        ("fp16", False),
        ("fp16", True),
        ("bf16", False),
        ("bf16", True),
    }
    spec = gpu_check.spec_text(rows[1], "/c.json", "/d.txt", "/out", gpu="auto", batch=8, seq=2048, steps=6)
    assert "gradient_checkpointing = true" in spec and "fp16 = true" in spec and 'gpu = "auto"' in spec


@pytest.mark.slow
def test_cpu_mode_trains_one_case_and_records_what_a_cpu_measures(tmp_path):
    out = tmp_path / "rows.json"
    r = run(
        [
            sys.executable,
            str(BENCH / "gpu_check.py"),
            "--device",
            "cpu",
            "--families",
            "gpt2",
            "--precisions",
            "fp16",
            "--checkpointing",
            "on",
            "--steps",
            "2",
            "--json",
            str(out),
            "--no-write",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["family"] == "gpt2" and row["ckpt"] is True and row["device"] == "cpu"
    assert row["planned"] == "fp32"  # fp16 on CPU: planned in fp32, the row says so
    m, p = row["measured"], row["plan"]
    assert m["rss"] > 100 * 2**20 and m["tokens_per_second"] > 0 and m["allocated"] is None
    assert m["loss_first"] > 0 and p["allocated"] > 0 and p["workload"]["gradient_checkpointing"] is True
    table = gpu_check.render(data["rows"], data["summary"])
    assert "| gpt2 | full | fp16 (fp32) | on | 2 x 64 |" in table


def test_adapter_rows_fine_tune_a_saved_base_not_a_from_scratch_model():
    case = dict(family="llama", method="qlora", precision="bf16", ckpt=False)
    spec = gpu_check.spec_text(case, "/tmp/base-llama", "/d.txt", "/out", gpu="cpu", batch=2, seq=64, steps=3)
    assert 'name_or_path = "/tmp/base-llama"' in spec and 'method = "qlora"' in spec
    assert "from_scratch" not in spec and "config =" not in spec
    assert set(gpu_check.METHODS) == {"full", "lora", "qlora", "grpo", "grpo-vllm"}


@pytest.mark.slow
def test_cpu_mode_trains_lora_and_qlora_rows_on_a_saved_base(tmp_path):
    out = tmp_path / "rows.json"
    r = run(
        [
            sys.executable,
            str(BENCH / "gpu_check.py"),
            "--device",
            "cpu",
            "--families",
            "llama",
            "--precisions",
            "bf16",
            "--checkpointing",
            "off",
            "--methods",
            "lora,qlora",
            "--json",
            str(out),
            "--no-write",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [row["method"] for row in data["rows"]] == ["lora", "qlora"]
    for row in data["rows"]:
        m, p = row["measured"], row["plan"]
        assert m["loss_first"] > 0 and m["loss_last"] > 0 and m["tokens_per_second"] > 0  # it trained
        assert p["allocated"] > 0 and p["tokens_per_second"] > 0  # the plan's figures beside it
        assert p["workload"]["adapters"]["method"] == row["method"]
    table = gpu_check.render(data["rows"], data["summary"])
    assert "| llama | lora | bf16 (bf16) | off | 2 x 64 |" in table and "| llama | qlora | bf16 (bf16) | off |" in table


def test_gpu_table_puts_measured_beside_planned():
    row = dict(
        family="llama",
        method="full",
        precision="bf16",
        planned="bf16",
        ckpt=False,
        batch=8,
        seq_len=2048,
        measured=dict(
            allocated=40 * 2**30,
            reserved=44 * 2**30,
            nvml_used=45 * 2**30,
            nvml_source="pynvml",
            device_used=46 * 2**30,
            tokens_per_second=100000.0,
        ),
        plan=dict(allocated=42 * 2**30, reserved=46 * 2**30, tokens_per_second=90000.0),
    )
    table = gpu_check.render([row], dict(device="cuda", gpu="H100-80GB", wall_s=300, skipped=0, budget_s=450))
    assert (
        "| llama | full | bf16 (bf16) | off | 8 x 2048 | 40.00 | 42.00 (+5.0%) | 44.00 | 46.00 (+4.5%) | 45.00 / 46.00 | 100,000 | 90,000 |"
    ) in table


def test_the_matrix_has_one_grpo_row_per_generation_backend():
    rows = gpu_check.matrix(["llama", "gpt2"], ["full", "grpo", "grpo-vllm"], ["fp16", "bf16"])
    rl = [r for r in rows if r["method"] in gpu_check.RL_METHODS]
    assert rl == [
        dict(family="llama", method="grpo", precision="bf16", ckpt=False),
        dict(family="llama", method="grpo-vllm", precision="bf16", ckpt=False),
    ]
    assert len(rows) == 8 + 2
    assert gpu_check.vllm_missing("cpu") == "vLLM runs only on a GPU (apply refuses a vllm backend on CPU)"


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return gpu_check.save_base("llama", tmp_path_factory.mktemp("gpu_check") / "base-llama", device="cpu")


@pytest.mark.parametrize("method, backend", [("grpo", "transformers"), ("grpo-vllm", "vllm-colocate")])
def test_each_grpo_rows_spec_plans_on_a_gpu_with_its_generation(tiny_base, tmp_path, method, backend):
    from gpuplan.plan.build import plan_file
    from tests.helpers.planning import ENV

    case = dict(family="llama", method=method, precision="bf16", ckpt=False)
    spec = tmp_path / "spec.toml"
    text = gpu_check.spec_text(case, str(tiny_base), "/unused.txt", str(tmp_path / "run"), gpu="H100-80GB", batch=16, seq=2048, steps=6)
    spec.write_text(text)
    plan = plan_file(spec, environment=ENV)  # what the device run plans, on a catalog GPU instead of the detected one
    assert plan.resolved.training.objective.name == "grpo" and plan.resolved.rl.generation_backend == backend
    assert plan.resolved.rl.num_generations == gpu_check.RL_GENERATIONS and plan.resolved.rl.max_completion_length == 128
    g = gpu_check.plan_generation(plan)
    assert g["backend"] == backend and g["memory"] > 0 and g["seconds_per_step"] > 0
    assert "generation decode" in g["terms"] and "generation prefill" in g["terms"]
    if backend == "vllm-colocate":  # vLLM's share chosen by the fit search, and the weight sync priced
        assert 0 < g["vllm_gpu_memory_utilization"] < 1 and "weight sync to vLLM" in g["terms"]
    else:
        assert g["vllm_gpu_memory_utilization"] is None and "weight sync to vLLM" not in g["terms"]


@pytest.mark.slow
def test_cpu_mode_trains_the_grpo_row_and_skips_the_vllm_row_with_the_reason(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--device", "cpu", "--families", "llama", "--precisions", "bf16", "--methods", "grpo,grpo-vllm", "--steps", "2"]
    r = run(
        [sys.executable, str(BENCH / "gpu_check.py"), *args, "--json", str(out), "--no-write"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["method"] == "grpo" and row["batch"] == gpu_check.RL_GENERATIONS
    m, g = row["measured"], row["plan"]["generation"]
    assert m["train_runtime_s"] > 0 and m["rss"] > 100 * 2**20  # it trained (two GRPO steps of TRL's GRPOTrainer)
    assert g["backend"] == "transformers" and g["memory"] > 0 and g["seconds_per_step"] > 0
    (skipped,) = data["summary"]["not_run"]
    assert skipped["method"] == "grpo-vllm" and "vLLM runs only on a GPU" in skipped["reason"]
    table = gpu_check.render(data["rows"], data["summary"])
    assert "| grpo | transformers | 4 |" in table and "Not run: llama grpo-vllm: vLLM runs only on a GPU" in table
