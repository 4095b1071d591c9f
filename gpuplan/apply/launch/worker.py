"""One rank of a multi-process apply: `python -m gpuplan.apply.launch.worker PLAN.json [--resume-from DIR]`.

torchrun (apply/launch/torchrun.py) starts this on every rank with the same saved plan. Each rank
calls execute(plan); the Trainer joins the process group from torchrun's environment
(RANK, WORLD_SIZE, ...) and shards the data between the ranks; rank 0 alone writes
gpuplan-state.json, metrics.jsonl and the final model (state.py, metrics.py, Trainer.save_model).
Exit status: 0 trained, 1 an ApplyError (message on stderr, rank 0's state says "failed").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpuplan.apply.errors import ApplyError
from gpuplan.plan.types import Plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuplan.apply.launch.worker", description="Execute a saved gpuplan plan on one torchrun rank."
    )
    parser.add_argument("plan", help="plan JSON written by gpuplan apply (or gpuplan plan --out)")
    parser.add_argument("--resume-from", metavar="DIR", help="Trainer checkpoint to continue (decided by gpuplan apply)")
    parser.add_argument("--progress", action="store_true", help="show the progress line on rank 0 (progress_line.py)")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        with open(args.plan, encoding="utf-8") as f:
            plan = Plan.from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"Error: {args.plan}: not a readable gpuplan plan ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    from gpuplan.apply.train.execute import execute

    def echo(line: str) -> None:
        if rank == 0:  # one summary for the run, not one per rank
            print(line, flush=True)

    from gpuplan.render.notices import captured, log_to

    try:
        with captured(summary=rank == 0):  # library notices to output.dir/gpuplan-debug.log, as in `apply`
            log_to(None, load_libraries=True)  # execute names output.dir's log once the run starts
            execute(plan, echo=echo, progress=args.progress, resume_from=args.resume_from)
    except ApplyError as e:
        print(f"Error (rank {rank}): {e.message}", file=sys.stderr)
        return 1
    finally:
        _destroy_process_group()
    return 0


def _destroy_process_group() -> None:
    """Leave the process group cleanly (torch warns at exit when a group is left open)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
