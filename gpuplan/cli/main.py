"""The gpuplan command: plan, apply, show, validate, schema, gpus, init, fmt, data, lock.

Exit codes follow Terraform: 0 success, 1 error, 2 (with --detailed-exitcode) when
the plan differs from the last applied state; errors become exit codes here and
nowhere else. Heavy imports (torch, transformers) happen only inside `apply` and
`plan --trace`.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from gpuplan.cli.apply import cmd_apply
from gpuplan.cli.common import UserError, report
from gpuplan.cli.data import cmd_data
from gpuplan.cli.lock import cmd_lock
from gpuplan.cli.parser import build_parser
from gpuplan.cli.plan import cmd_gpus, cmd_plan, cmd_schema, cmd_validate
from gpuplan.cli.spec_files import cmd_fmt, cmd_init
from gpuplan.cli.state import cmd_show
from gpuplan.plan.types import PlanError

COMMANDS = {"plan": cmd_plan, "apply": cmd_apply, "show": cmd_show, "validate": cmd_validate, "schema": cmd_schema, "gpus": cmd_gpus,
            "init": cmd_init, "fmt": cmd_fmt, "data": cmd_data, "lock": cmd_lock}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 1
    try:
        return COMMANDS[args.command](args)
    except PlanError as e:
        report(e.diagnostics, args)
        return 1
    except UserError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in gpuplan, not a user mistake
        if os.environ.get("GPUPLAN_DEBUG"):
            raise
        print(f"gpuplan: internal error ({type(e).__name__}: {e}); this is a bug in gpuplan. "
              "Run with GPUPLAN_DEBUG=1 for the traceback.", file=sys.stderr)
        return 1

