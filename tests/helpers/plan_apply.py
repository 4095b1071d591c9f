"""Randomized plan -> apply (issue 30): generated specs, planned by the real planner, applied for one step
on CPU by the real executor, whose audit (gpuplan/apply/train/audit.py) must pass.

A case is a draw over objective x method x savers x data format x precision. Each ends one way:
- "refused": the plan is refused with a PlanError whose every error names a key (a clear error);
- "applied": one optimizer step ran and the state's audit checked both stages with nothing differing;
- "failed": the plan succeeded and apply failed (an ApplyError, an AuditError or a crash): the bug
  class this test exists to find. `known_defect(case)` names the issue-30 defect a failure is expected
  from while that defect is open.

Used by tests/apply/test_plan_apply_fuzz.py (a few seeded cases) and benchmarks/plan_apply_fuzz.py.
"""

from __future__ import annotations

import json
import random
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.helpers.apply_plans import MICRO_LLAMA
from tests.helpers.planning import ENV
from tests.helpers.preference_rows import conversational, kto_rows, pairs, write_jsonl

OBJECTIVES = ("sft", "dpo", "kto")
METHODS = ("full", "lora", "qlora", "dora")
FORMATS = ("text", "chat", "instruction", "preference", "preference-conversational")
OPTIMS = ("adamw_torch", "paged_adamw_8bit", "paged_adamw_32bit")
PRECISIONS = ("fp32", "bf16-weights", "bf16-amp", "fp16-amp")

# hidden 64: bitsandbytes' CPU 4-bit kernels need in_features >= 64 (tests/helpers/lora_base.py)
BASE_LLAMA = dict(MICRO_LLAMA, hidden_size=64, intermediate_size=128, initializer_range=0.2)


@dataclass(frozen=True)
class Case:
    objective: str
    method: str
    data: str
    gradient_checkpointing: bool
    loss_chunk_size: int
    activation_offloading: bool
    optim: str
    precision: str
    lora_dropout: float
    effective_batch_size: int

    @property
    def label(self) -> str:
        savers = "+".join(
            n
            for n, on in (
                ("ckpt", self.gradient_checkpointing),
                (f"chunk{self.loss_chunk_size}", self.loss_chunk_size),
                ("offload", self.activation_offloading),
                (self.optim, self.optim != "adamw_torch"),
            )
            if on
        )
        return f"{self.objective}-{self.method}-{self.data}-{self.precision}-b{self.effective_batch_size}-d{self.lora_dropout}" + (
            f"-{savers}" if savers else ""
        )


def draw(rnd: random.Random) -> Case:
    return Case(
        objective=rnd.choice(OBJECTIVES),
        method=rnd.choice(METHODS),
        data=rnd.choice(FORMATS),
        gradient_checkpointing=rnd.random() < 0.5,
        loss_chunk_size=rnd.choice((0, 0, 0, 16)),
        activation_offloading=rnd.random() < 0.15,
        optim=rnd.choice(OPTIMS),
        precision=rnd.choice(PRECISIONS),
        lora_dropout=rnd.choice((0.0, 0.0, 0.1)),
        effective_batch_size=rnd.choice((1, 2, 4)),
    )


def cases(n: int, seed: int) -> list[Case]:
    rnd = random.Random(seed)
    return [draw(rnd) for _ in range(n)]


def known_defect(case: Case) -> int | str | None:
    """The known cause a failure of `case` is expected from (an issue-30 defect number while it is
    open), or None: then a failure is a new bug. None is open now."""
    # defects 1 (bf16 adapters under QLoRA), 2 (TRL's disable_dropout) and 7 (KTO at batch 1) are fixed:
    # the audit now passes on those cases, and the plan refuses KTO at batch 1. The two causes this fuzz
    # found besides (SFT on preference rows: no such field data.text_field / messages_field; DPO / KTO
    # on a .txt file) are plan-time refusals now (spec/data_fields.py, plan/rules/preference.py).
    del case
    return None


def cause_of(case: Case, detail: str) -> int | str | None:
    """The known cause a failure's message shows (None: not one of them)."""
    preference = case.objective in ("dpo", "kto")
    if preference and "model.trainable_dtype: planned ['float32'], live ['bfloat16']" in detail:
        return 1
    if preference and "lora.lora_dropout: planned" in detail:
        return 2
    if "batch size must be > 1" in detail:
        return 7
    return None


def random_base(directory: Path) -> str:
    """A real, randomly initialised tiny Llama saved with safetensors: the base adapters need."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gpuplan.apply.data.tokenizer import byte_level_tokenizer

    cfg = dict(BASE_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    out = directory / "base"
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    byte_level_tokenizer().save_pretrained(out)
    return str(out)


def _text(path: Path) -> str:
    rnd = random.Random(0)
    words = ["ping", "pong", "zig", "zag", "tick", "tock"]
    path.write_text("\n".join(" ".join(rnd.choice(words) for _ in range(12)) + "." for _ in range(200)) + "\n")
    return str(path)


def write_data(case: Case, directory: Path) -> tuple[str, dict[str, Any]]:
    """The case's training file and the [data] keys that describe it."""
    if case.data == "text":
        return _text(directory / "text.txt"), {"format": "text"}
    if case.data == "chat":
        rows = [{"messages": [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["chosen"]}]} for p in pairs(32)]
        return write_jsonl(directory / "chat.jsonl", rows), {"format": "chat", "chat_template": "chatml"}
    if case.data == "instruction":
        rows = [{"prompt": p["prompt"], "response": p["chosen"]} for p in pairs(32)]
        return write_jsonl(directory / "instruction.jsonl", rows), {"format": "instruction"}
    kto = case.objective == "kto"
    if case.data == "preference":
        return write_jsonl(directory / "pref.jsonl", kto_rows(32) if kto else pairs(32)), {}
    rows = conversational(pairs(32))
    if kto:
        rows = [{"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"} for r in rows for side in ("chosen", "rejected")]
    return write_jsonl(directory / "pref-conv.jsonl", rows), {"format": "chat", "chat_template": "chatml"}


def _toml(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def spec_text(case: Case, base: str, data_file: str, data_keys: dict[str, Any], out: Path, max_steps: int = 1) -> str:
    model: dict[str, Any] = {"name_or_path": base, "method": "lora" if case.method == "dora" else case.method}
    training: dict[str, Any] = {
        "objective": case.objective,
        "effective_batch_size": case.effective_batch_size,
        "learning_rate": 1e-3,
        "max_steps": max_steps,
        "logging_steps": 1,
        "save_steps": 1000,
        "seed": 0,
        "gradient_checkpointing": case.gradient_checkpointing,
        "loss_chunk_size": case.loss_chunk_size,
        "activation_offloading": case.activation_offloading,
        "optim": case.optim,
    }
    if case.precision == "bf16-weights":
        model["dtype"] = "bfloat16"
    training["bf16"] = case.precision == "bf16-amp"
    training["fp16"] = case.precision == "fp16-amp"
    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": case.lora_dropout, "use_dora": case.method == "dora"}
    sections = {
        "model": model,
        "lora": lora,
        "hardware": {"gpu": "cpu"},
        "data": {"train_files": [data_file], "seq_len": 128, **data_keys},
        "training": training,
        "output": {"dir": str(out)},
    }
    return "".join(f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items()) + "\n" for name, body in sections.items())


@dataclass
class Outcome:
    case: Case
    result: str  # "refused" | "applied" | "failed"
    detail: str
    checks: int = 0
    known_defect: int | str | None = None  # the cause the failure's message shows (cause_of)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "case": self.case.label}


def _clear(errors: Any) -> bool:
    """A clear refusal: every error has a summary, and names a key or the spec."""
    return bool(errors) and all(d.summary and (d.key or "spec" in d.summary or "data" in d.summary) for d in errors)


def plan_case(case: Case, directory: Path, base: str, max_steps: int = 1) -> Any:
    """The real planner's plan of the case's spec (PlanError when refused)."""
    from gpuplan.plan.build import plan_file

    directory.mkdir(parents=True, exist_ok=True)
    data_file, data_keys = write_data(case, directory)
    spec = directory / "spec.toml"
    spec.write_text(spec_text(case, base, data_file, data_keys, directory / "run", max_steps))
    return plan_file(spec, environment=ENV)


SFT = Case("sft", "full", "text", False, 0, False, "adamw_torch", "fp32", 0.0, 4)


def run(case: Case, directory: Path, base: str) -> Outcome:
    """Plan the case's spec; apply it for one step when it plans."""
    from gpuplan.apply.train.execute import execute
    from gpuplan.errors import GpuplanError
    from gpuplan.lifecycle.state import load_state

    def failed(detail: str) -> Outcome:
        return Outcome(case, "failed", detail, known_defect=cause_of(case, detail))

    try:
        plan = plan_case(case, directory, base)
    except GpuplanError as e:
        errors = [d for d in e.diagnostics if d.severity == "error"]
        if _clear(errors):
            return Outcome(case, "refused", "; ".join(f"{d.key}: {d.summary}" for d in errors))
        return failed(f"unclear refusal: {e.message}")
    except Exception as e:  # noqa: BLE001 - a planner crash is a finding
        return failed(f"plan crashed: {type(e).__name__}: {e}")
    try:
        execute(plan, echo=lambda s: None, progress=False)
    except GpuplanError as e:
        return failed(f"{type(e).__name__}: {e.message}")
    except Exception as e:  # noqa: BLE001
        return failed(f"crash {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}")
    res = (load_state(directory / "run") or {}).get("results") or {}
    audit = res.get("audit") or {}
    if res.get("global_step") != 1 or audit.get("stages") != ["build", "train-begin"] or audit.get("differed"):
        return failed(f"applied but step {res.get('global_step')}, audit {audit.get('differed')}")
    return Outcome(case, "applied", "", checks=int(audit["checks"]))
