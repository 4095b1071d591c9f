"""torch.compile (guide: "torch.compile"; TrainingArguments __post_init__).

A backend or mode set turns compile on, as TrainingArguments does; compile
explicitly off with a backend set is a contradiction (axolotl errors too). The
backend defaults to inductor and must be one torch._dynamo knows (names in
gpuplan/spec/names.py). inductor on CPU needs a C++ compiler; on GPU, triton.
"""

from __future__ import annotations

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.inputs.target import install_note, is_local
from gpuplan.spec.names import COMPILE_BACKEND_PACKAGES


def compile_settings(ctx: Resolver) -> None:
    on = ctx.spec("training.torch_compile")
    backend = ctx.spec("training.torch_compile_backend")
    mode = ctx.spec("training.torch_compile_mode")
    extras = [k for k, v in (("torch_compile_backend", backend), ("torch_compile_mode", mode)) if v is not None]
    if not on and extras:
        if ctx.is_user("training.torch_compile"):
            ctx.error(
                "training.torch_compile",
                f"training.torch_compile = false but training.{extras[0]} is set",
                fix=f"remove training.{extras[0]} or set training.torch_compile = true",
            )
            ctx.keep("training.torch_compile")
        else:
            ctx.resolve(
                "training.torch_compile",
                True,
                f"training.{extras[0]} is set, which turns torch.compile on (as TrainingArguments does)",
            )
            on = True
    else:
        ctx.keep("training.torch_compile")
    if on and backend is None:
        ctx.resolve("training.torch_compile_backend", "inductor", "torch.compile's default backend (TorchInductor)")
    else:
        ctx.keep("training.torch_compile_backend")
    cc = ctx.gpu.compute_capability
    if on and (backend in (None, "inductor")) and ctx.gpu.vendor == "nvidia" and cc and cc < (7, 0):
        ctx.error(
            "training.torch_compile_backend",
            f"inductor's triton kernels need compute capability >= 7.0; {ctx.gpu.name} has {cc}",
            fix='set training.torch_compile_backend = "aot_eager" or training.torch_compile = false',
        )
    if on and mode is not None and backend not in (None, "inductor"):
        ctx.error(
            "training.torch_compile_mode",
            f'training.torch_compile_mode = "{mode}" only applies to the inductor backend; '
            f'torch.compile ignores it with backend "{backend}"',
            fix='remove training.torch_compile_mode or set training.torch_compile_backend = "inductor"',
        )
    package = COMPILE_BACKEND_PACKAGES.get(backend)
    if on and package:
        if is_local(ctx.spec) and not ctx.environment.has(package):
            ctx.error(
                "training.torch_compile_backend",
                f'the "{backend}" backend needs the {package} package, which is not installed',
                fix=f'pip install {package}, or set training.torch_compile_backend = "inductor"',
            )
        elif not is_local(ctx.spec):
            install_note(ctx, "training.torch_compile_backend", package, f'the "{backend}" compile backend')
    if on and backend == "cudagraphs" and ctx.gpu.is_cpu:
        ctx.error(
            "training.torch_compile_backend",
            'the "cudagraphs" backend needs a CUDA GPU; hardware is cpu',
            fix='set training.torch_compile_backend = "inductor"',
        )


RULES = (
    Rule(
        "compile.backend",
        reads=(
            "spec:training.torch_compile",
            "spec:training.torch_compile_backend",
            "spec:training.torch_compile_mode",
            "spec:hardware.gpu",
            "spec:hardware.nodes",
        ),
        writes=("training.torch_compile", "training.torch_compile_backend"),
        apply=compile_settings,
        doc="backend/mode set turns compile on; default backend inductor; backend must exist and suit the device.",
    ),
)
