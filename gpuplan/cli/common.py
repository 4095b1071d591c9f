"""What the commands share: styling, reporting diagnostics, hardware detection, planning a spec,
and writing user-visible files. UserError (gpuplan.errors) is re-exported for the commands."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from gpuplan.errors import Diagnostic, UserError
from gpuplan.render.style import Style
from gpuplan.render.text import render_diagnostics

__all__ = ["UserError", "detect_hardware", "make_plan", "report", "style_for", "write_atomic"]


def style_for(args, stream) -> Style:
    return Style(False) if getattr(args, "no_color", False) else Style.for_stream(stream)


def report(diags: Sequence[Diagnostic], args) -> None:
    text = render_diagnostics([d.to_dict() for d in diags], style_for(args, sys.stderr))
    print("\n".join(text), file=sys.stderr)


def detect_hardware():
    from gpuplan.hardware.detect import (
        detect,  # the CLI edge: detection only when "auto" asks
    )

    return detect()[0]


def make_plan(spec_path: str, args):
    from gpuplan.plan.build import plan_file
    from gpuplan.plan.inputs.environment import local_environment

    overrides = {"hardware": {"gpu": args.gpu}} if args.gpu else None
    prices, calibrations = user_files()
    return plan_file(
        spec_path,
        detect=detect_hardware,
        environment=local_environment(),
        strict=args.strict,
        overrides=overrides,
        prices=prices,
        calibrations=calibrations,
    )


def user_files():
    """(the user's prices, the measured runs): read at the edge, passed into the pure planner."""
    from gpuplan.hardware.userfiles import UserFileError, read_calibrations, read_user_prices

    try:
        return read_user_prices(), read_calibrations()
    except UserFileError as e:
        raise UserError(str(e)) from None


def write_atomic(path: str | Path, text: str) -> None:
    """Write a user-visible file crash-safely; an OS error is a user error, not a traceback."""
    from gpuplan.fsutil import write_text_atomic

    try:
        write_text_atomic(path, text)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}", fix="choose a writable path") from None
