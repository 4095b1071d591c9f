"""The gpuplan command: plan, apply, show, validate, schema, gpus, init, fmt, compare, calibration, data, lock,
tune, and after a run: generate, chat, eval, export.

Exit codes follow Terraform: 0 success, 1 error, 2 (with --detailed-exitcode) when
the plan differs from the last applied state; errors become exit codes here and
nowhere else. Heavy imports (torch, transformers) happen only inside `apply`,
`plan --trace` and the after-run commands (gpuplan/after).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gpuplan.cli.apply import cmd_apply
from gpuplan.cli.calibration import cmd_calibration
from gpuplan.cli.common import report
from gpuplan.cli.compare import cmd_compare
from gpuplan.cli.data import cmd_data
from gpuplan.cli.eval import cmd_eval
from gpuplan.cli.export import cmd_export
from gpuplan.cli.generate import cmd_chat, cmd_generate
from gpuplan.cli.lock import cmd_lock
from gpuplan.cli.parser import build_parser
from gpuplan.cli.plan import cmd_gpus, cmd_plan, cmd_schema, cmd_validate
from gpuplan.cli.spec_files import cmd_fmt, cmd_init
from gpuplan.cli.state import cmd_show
from gpuplan.cli.tune import cmd_tune
from gpuplan.errors import GpuplanError

COMMANDS = {
    "plan": cmd_plan,
    "apply": cmd_apply,
    "show": cmd_show,
    "validate": cmd_validate,
    "schema": cmd_schema,
    "gpus": cmd_gpus,
    "init": cmd_init,
    "fmt": cmd_fmt,
    "compare": cmd_compare,
    "calibration": cmd_calibration,
    "data": cmd_data,
    "lock": cmd_lock,
    "generate": cmd_generate,
    "chat": cmd_chat,
    "eval": cmd_eval,
    "export": cmd_export,
    "tune": cmd_tune,
}
# a closed stdout pipe: what the shell reports for a tool that SIGPIPE ends (128 + 13), as cat gets in `cat big | head -1`
CLOSED_PIPE = 141
# the commands that import libraries that talk (render/notices.py)
QUIET = ("plan", "apply", "data", "init", "generate", "chat", "eval", "export", "tune")


def main(argv: Sequence[str] | None = None) -> int:
    code = None
    try:
        try:
            code = dispatch(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's own flush at exit
    except BrokenPipeError:
        closed_pipe()
        return code or CLOSED_PIPE
    return code


def closed_pipe() -> None:
    """The reader of stdout went away (`gpuplan compare SPEC | head -1`): a normal end, and nothing to say,
    as for any Unix tool that `head` stops reading. Python's recipe (docs.python.org/3/library/signal.html,
    "Note on SIGPIPE"): point stdout at devnull so the interpreter's flush at exit does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (replaced in-process): the interpreter flushes nothing
        pass


def dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 1
    from gpuplan.apply.train.interrupt import ApplyInterrupted  # stdlib only: no torch

    try:
        if args.command not in QUIET:
            return COMMANDS[args.command](args)
        from gpuplan.render.notices import captured  # library notices to output.dir's debug log (render/notices.py)

        with captured():
            return COMMANDS[args.command](args)
    except BrokenPipeError:  # stdout's reader went away: main() ends quietly
        raise
    except GpuplanError as e:  # every user-fixable failure: spec, plan, state, apply, lock, flags
        report(e.diagnostics, args)
        return 1
    except (ApplyInterrupted, KeyboardInterrupt) as e:
        what = str(e) if isinstance(e, ApplyInterrupted) else "interrupted"
        if args.command == "apply":
            what = f"{what[0].upper()}{what[1:]}. Resume with: gpuplan apply {args.target} --yes"
        print(what, file=sys.stderr)
        return 130
    except Exception as e:  # a bug in gpuplan, not a user mistake
        if os.environ.get("GPUPLAN_DEBUG"):
            raise
        print(
            f"gpuplan: internal error ({type(e).__name__}: {e}); this is a bug in gpuplan. Run with GPUPLAN_DEBUG=1 for the traceback.",
            file=sys.stderr,
        )
        return 1
