"""`gpuplan export`: a finished run as a standalone safetensors model, and how to serve it.

Checked before anything loads: the run, --to (new or empty, in a folder that exists),
--dtype, --context. The model is written into a temporary folder beside --to and
renamed into place, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import sys

from gpuplan.cli.common import UserError
from gpuplan.units import GIB, MIB


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def cmd_export(args) -> int:
    if args.context is not None and not 1 <= args.context <= 2**24:
        raise UserError(f"--context {args.context} must be a number of tokens, at least 1", fix="e.g. --context 4096")
    if args.checkpoint is not None and args.checkpoint < 0:
        raise UserError(f"--checkpoint {args.checkpoint} must be a step number (a checkpoint-N folder)")
    from gpuplan.after.export import check_destination, export, export_dtype, memory_for, serve_commands
    from gpuplan.after.finished_run import finished_run
    from gpuplan.cli.apply import check_remote_code

    dest = check_destination(args.to)
    run = finished_run(args.spec, args.checkpoint, command="gpuplan export")
    check_remote_code(run.plan, args.trust_remote_code)
    dtype = export_dtype(run, args.dtype)
    context = args.context or run.plan.resolved.data.seq_len
    from gpuplan.render.notices import log_to

    log_to(run.output_dir, load_libraries=True)  # library notices to the run's gpuplan-debug.log (render/notices.py)
    written = export(run, dest, dtype)
    task = run.plan.resolved.model.task
    mem = memory_for(dest, task, dtype, context)
    serve = serve_commands(dest, dtype, context) if task == "causal-lm" else []
    if args.json:
        print(json.dumps({**written, "inference_memory": mem.to_dict(), "serve": serve}, indent=2))
        return 0
    print(f"Exported {written['source']}\n  to {dest} ({dtype}): {', '.join(written['files'])}")
    print(f"Inference memory for one sequence of {context:,} tokens in {dtype} (gpuplan's memory model):")
    print(
        f"  weights {_size(mem.weights_bytes)}, KV cache {_size(mem.kv_cache_bytes)} "
        f"({mem.kv_bytes_per_token:,} bytes per token), prefill activations {_size(mem.activation_bytes)}, "
        f"CUDA context and allocator {_size(mem.overhead_bytes)}: {_size(mem.total_bytes)} on one GPU"
    )
    if serve:
        print("Serve it with one of:")
        print("\n".join(f"  {c}" for c in serve))
    else:
        print(f"A {task} model: load it with transformers (AutoModelFor... .from_pretrained({dest!r}))", file=sys.stderr)
    return 0
