"""Data preloading (guide: "Data preloading"; Trainer and Oumi defaults in peer-rules.md).

Pinned memory only helps host-to-GPU copies: on with CUDA, off on CPU (the Trainer
turns it off there too). Workers: min(2 x GPUs per node, 8) as Oumi does, capped by
the CPU cores per GPU minus one for the training process; on CPU, 0 (workers would
compete with the training threads for the same cores).
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.inputs.target import is_local


def pin_memory(ctx: Resolver) -> None:
    want = ctx.spec("training.dataloader_pin_memory")
    cuda = not ctx.gpu.is_cpu
    if want == "auto":
        ctx.resolve(
            "training.dataloader_pin_memory",
            cuda,
            "pinned host memory speeds host-to-GPU copies" if cuda else "CPU training: nothing to pin for",
        )
    elif want is True and not cuda:
        ctx.resolve("training.dataloader_pin_memory", False, "CPU training: pinned memory only helps copies to a GPU")
    else:
        ctx.keep("training.dataloader_pin_memory")


def num_workers(ctx: Resolver) -> None:
    want = ctx.spec("training.dataloader_num_workers")
    if want != "auto":
        ctx.keep("training.dataloader_num_workers")
        return
    gpus = ctx.spec("hardware.count")
    if not ctx.gpu.is_cpu and not ctx.spec("hardware.cpu_count") and not is_local(ctx.spec):
        n = min(2 * gpus, 8)  # the training hosts' cores are not this machine's
        ctx.resolve(
            "training.dataloader_num_workers",
            n,
            f"min(2 x {gpus} GPU(s), 8); the training hosts' cores are unknown (set hardware.cpu_count to cap it at cores per GPU - 1)",
        )
        return
    cpus = ctx.spec("hardware.cpu_count") or ctx.environment.cpu_count or 1
    if ctx.gpu.is_cpu:
        ctx.resolve(
            "training.dataloader_num_workers",
            0,
            "CPU training: loading in the main process; workers would take cores from the training threads",
        )
        return
    per_gpu = max(0, cpus // gpus - 1)
    n = min(2 * gpus, 8, per_gpu)
    ctx.resolve(
        "training.dataloader_num_workers",
        n,
        f"min(2 x {gpus} GPU(s), 8) capped at {per_gpu} = {cpus} CPU cores / {gpus} GPU(s) - 1 for the trainer",
    )


RULES = (
    Rule(
        "dataloader.pin_memory",
        reads=("spec:training.dataloader_pin_memory",),
        writes=("training.dataloader_pin_memory",),
        apply=pin_memory,
        doc="pin memory only with CUDA.",
    ),
    Rule(
        "dataloader.workers",
        reads=(
            "spec:training.dataloader_num_workers",
            "spec:hardware.count",
            "spec:hardware.cpu_count",
            "spec:hardware.gpu",
            "spec:hardware.nodes",
        ),
        writes=("training.dataloader_num_workers",),
        apply=num_workers,
        doc="workers from the CPU count: min(2 x GPUs, 8, cores per GPU - 1); 0 on CPU.",
    ),
)
