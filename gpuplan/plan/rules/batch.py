"""Batch split (guide: "Batch size", "Gradient accumulation").

Writes what memory.fit chose, with the reason for each value: the per-device batch
(tensor-core multiple where memory allows), the accumulation that holds the
effective batch, and the effective batch itself when it was derived.
"""

from __future__ import annotations

from gpuplan.plan.context import Resolver
from gpuplan.plan.graph import Rule
from gpuplan.plan.rules.common import FIT_PROBLEM, FIT_SOLUTION, TRAINER_DEFAULT_BATCH, world_size
from gpuplan.units import GIB

KEYS = (
    "training.effective_batch_size",
    "training.per_device_train_batch_size",
    "training.gradient_accumulation_steps",
    "training.per_device_eval_batch_size",
)


def split(ctx: Resolver) -> None:
    sol, p = ctx.get(FIT_SOLUTION), ctx.get(FIT_PROBLEM)
    if sol is None:
        for k in KEYS:
            ctx.keep(k)
        return
    world = world_size(ctx)
    b, a = sol.per_device_batch, sol.accumulation
    e = b * a * world
    m = p.tensor_multiple
    where = f"{world} GPU(s)" if ctx.gpu.vendor != "cpu" else "the CPU"
    if ctx.spec("training.effective_batch_size") is None:
        if ctx.is_user("training.per_device_train_batch_size"):
            why = (f"per_device_train_batch_size x gradient_accumulation_steps x "
                   f"{'GPUs' if ctx.gpu.vendor != 'cpu' else 'CPU processes'} = {b} x {a} x {world}")
        else:
            why = (f"no effective_batch_size given: the Trainer's default of {TRAINER_DEFAULT_BATCH} per device "
                   f"x {world} device(s)")
            ctx.note("training.effective_batch_size", f"effective batch {e} is the Trainer default, not a choice",
                     fix="set training.effective_batch_size to what your recipe needs; gpuplan then picks the split")
        ctx.resolve("training.effective_batch_size", e, why)
    else:
        ctx.keep("training.effective_batch_size")

    usable = p.usable_bytes / GIB
    user_b = ctx.spec("training.per_device_train_batch_size")
    if user_b != "auto" and user_b != b:
        if user_b % m and b % m == 0:
            ctx.resolve("training.per_device_train_batch_size", b,
                        f"tensor-core multiple: {ctx.gpu.name} runs {_dtype(ctx)} GEMMs best at multiples of {m} "
                        f"(NVIDIA matmul guide); {b} is the nearest that fits and divides the {b * a} samples per device",
                        rule="batch.tensor_core_multiple")
        else:
            ctx.resolve("training.per_device_train_batch_size", b,
                        f"{user_b} per device needs more than the {usable:.1f} GiB usable; {b} is the nearest that fits",
                        rule="batch.fit")
    elif user_b == "auto":
        tail = f", a multiple of {m} for tensor cores" if m > 1 and b % m == 0 else ""
        ctx.resolve("training.per_device_train_batch_size", b,
                    f"largest per-device batch that fits in {usable:.1f} GiB and divides {b * a} samples per device{tail}",
                    rule="batch.fit")
    else:
        ctx.keep("training.per_device_train_batch_size")
    if not sol.on_tensor_multiple and m > 1 and sol.fits:
        if (b * a) % m == 0:  # a multiple divides the per-device samples: memory is the limit
            ctx.note("training.per_device_train_batch_size",
                     f"per-device batch {b} is not a multiple of {m} (tensor cores): {m} per device does not fit",
                     fix="more GPUs or memory savers (set them to \"auto\") make room for a multiple")
        else:
            ctx.note("training.per_device_train_batch_size",
                     f"per-device batch {b} is not a multiple of {m} (tensor cores): none divides the {b * a} samples per device",
                     fix=f"an effective batch divisible by {m * world} lets gpuplan use a multiple of {m}")

    if ctx.spec("training.gradient_accumulation_steps") == "auto":
        why = (f"holds the effective batch: {e} = {b} per device x {a} step(s) x {where}" if a > 1
               else f"the effective batch {e} fits in one pass per device: no accumulation (the guide: many steps slow training)")
        ctx.resolve("training.gradient_accumulation_steps", a, why, rule="batch.split")
    elif ctx.spec("training.gradient_accumulation_steps") != a:
        ctx.resolve("training.gradient_accumulation_steps", a, f"holds the effective batch {e} at {b} per device", rule="batch.split")
    else:
        ctx.keep("training.gradient_accumulation_steps")

    if ctx.spec("training.per_device_eval_batch_size") == "auto":
        ctx.resolve("training.per_device_eval_batch_size", b,
                    "same as the train batch: evaluation keeps no gradients or optimizer states")
    else:
        ctx.keep("training.per_device_eval_batch_size")


def _dtype(ctx: Resolver) -> str:
    if ctx.get("training.bf16"):
        return "bf16"
    if ctx.get("training.fp16"):
        return "fp16"
    return "TF32"


RULES = (
    Rule("batch.split", reads=(FIT_SOLUTION, FIT_PROBLEM, "training.bf16", "training.fp16",
                               "spec:training.effective_batch_size", "spec:training.per_device_train_batch_size",
                               "spec:training.gradient_accumulation_steps", "spec:training.per_device_eval_batch_size",
                               "spec:hardware.count", "spec:hardware.nodes"),
         writes=KEYS, apply=split, explains=("batch.tensor_core_multiple", "batch.fit"),
         doc="effective = per-device x accumulation x GPUs; tensor-core multiples; accumulation kept small."),
)
