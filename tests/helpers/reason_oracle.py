"""Guard 2 of issue 11: every reason a plan prints agrees with the values it names.

`check_reasons(plan)` reads each change's reason, the throughput notes, the memory savers
and every diagnostic's fix, finds the claims they make about precision, batch, optimizer,
checkpointing, dtype and communication, and checks each against the resolved settings.
It returns how many claims it checked, so a test can tell a vacuous pass from a real one.
"""

from __future__ import annotations

import re

from gpuplan.plan.types import Plan
from gpuplan.spec.objectives import objective

BNB_8BIT = ("8bit",)


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def check_reasons(plan: Plan) -> int:
    v = plan.value
    checked = 0
    world = v("hardware.count") * v("hardware.nodes")
    b, a = v("training.per_device_train_batch_size"), v("training.gradient_accumulation_steps")
    # tokens per example in the GEMMs: a DPO example is its chosen and rejected sequences (spec/objectives.py)
    seq = v("data.seq_len") * objective(plan.get("training.objective")).grad_sequences
    if objective(plan.get("training.objective")).is_rl:  # an RL sequence is prompt + completion (plan.resolved.rl)
        seq = plan.resolved.rl.sequence_length or seq
    bf16, fp16 = v("training.bf16"), v("training.fp16")
    optim = v("training.optim")
    ds_offload = plan.get("distributed.strategy") == "deepspeed" and plan.get("distributed.offload_optimizer")
    for c in plan.changes:
        r = c.reason
        # precision
        if re.search(r"(?<!no )fp16 mixed precision", r) and "CPU" not in r:
            assert fp16 is True, (c, "says fp16 mixed precision; fp16 is off")
            checked += 1
        if re.search(r"(?<!no )bf16 mixed precision", r):
            assert bf16 is True, (c, "says bf16 mixed precision; bf16 is off")
            checked += 1
        if "the run is fp32" in r or "planned in fp32" in r:
            assert not bf16 and not fp16, (c, "says fp32; mixed precision is on")
            checked += 1
        if "fp32 matmuls run in TF32" in r:
            assert v("training.tf32") is True and plan.hardware.vendor == "nvidia", c
            checked += 1
        # batch
        m = re.search(r"(\d+) = (\d+) per device x (\d+) step\(s\) x (\d+)", r)
        if m:
            assert tuple(map(int, m.groups())) == (v("training.effective_batch_size"), b, a, world), (c, b, a, world)
            checked += 1
        m = re.search(r"(\d+) per device does not divide the (\d+) samples", r)
        if m:
            user, samples = map(int, m.groups())
            assert user == c.before and samples == b * a and samples % user, c
            checked += 1
        m = re.search(r"(\d+) per device needs ([\d.]+) GiB, more than the ([\d.]+) GiB usable", r)
        if m:
            assert int(m.group(1)) == c.before and (b * a) % c.before == 0, (c, "the batch divides: memory must be why")
            assert float(m.group(2)) > float(m.group(3)), c
            checked += 1
        m = re.search(r"(\d+) x (\d+) = ([\d,]+) is not a multiple of (\d+), (\d+) x (\d+) = ([\d,]+) is", r)
        if m:
            u, s1, t1, g, nb, s2, t2 = m.groups()
            assert int(s1) == int(s2) == seq and int(u) == c.before and int(nb) == b == c.after, c
            assert int(u) * seq == _num(t1) and _num(t1) % int(g) and b * seq == _num(t2) and _num(t2) % int(g) == 0, c
            assert (b * a) % c.before == 0, (c, "moved for the GEMM shape, so the user's batch divided")
            checked += 1
        m = re.search(r"divides (\d+) samples per device", r)
        if m and c.key == "training.per_device_train_batch_size":
            assert int(m.group(1)) == b * a, c
            checked += 1
        m = re.search(r"(\d+) x (\d+) = ([\d,]+) tokens per micro-batch, a multiple of (\d+)", r)
        if m:
            assert int(m.group(1)) == b and int(m.group(2)) == seq and b * seq == _num(m.group(3)) and b * seq % int(m.group(4)) == 0, c
            checked += 1
        # optimizer
        if c.key == "training.optim":
            if "fused AdamW" in r:
                assert optim == "adamw_torch_fused" and not ds_offload, c
            if "8-bit AdamW" in r:
                assert "8bit" in optim, c
            if "Adafactor's" in r:
                assert optim == "adafactor", c
            if "DeepSpeedCPUAdam" in r:
                assert ds_offload, c
            checked += 1
        # memory savers
        if c.key == "training.gradient_checkpointing":
            assert v("training.gradient_checkpointing") is ("does not fit without it" in r), c
            checked += 1
        # dataloader
        m = re.search(r"min\(2 x (\d+) GPU\(s\), 8\)", r)
        if m:
            assert int(m.group(1)) == v("hardware.count"), c
            checked += 1
        if "_supports_sdpa = False" in r:
            assert v("model.attn_implementation") != "sdpa", c
            checked += 1
    for s in plan.memory.savers:
        if s.name == "8-bit optimizer":
            assert "8bit" in optim
            adam = 8 if v("model.dtype") == "float32" else 4
            assert f"Adam states {adam} ->" in s.cost, s
        if s.name == "gradient checkpointing":
            assert v("training.gradient_checkpointing") is True
        if s.name == "Adafactor":
            assert optim == "adafactor"
        checked += 1
    t = plan.throughput
    assert not any("not included" in n for n in t.notes), t.notes
    if (t.communication or {}).get("time_s"):
        assert any("includes" in n or "hide behind compute" in n for n in t.notes), t.notes
        checked += 1
    # no fix asks for what the plan already has
    for d in plan.diagnostics:
        for key, value in re.findall(r'set (\w+\.\w+) = ("[^"]*"|true|false|\d+)\b', d.fix or ""):
            if key in plan.settings:
                want = {"true": True, "false": False}.get(value, value.strip('"') if value.startswith('"') else None)
                want = int(value) if want is None else want
                assert v(key) != want, (d, f"{key} is already {want!r}")
                checked += 1
    return checked
