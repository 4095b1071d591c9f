"""The command line, one module per command family; `main` is the entry point.

parser.py      the grammar (every command and flag)
main.py        dispatch and the one place errors become exit codes
common.py      shared by commands: styling, detection, planning, writing files
plan.py        plan, validate, schema, gpus
apply.py       apply (confirm, lock, resume, launch)
state.py       saved-plan staleness, drift, show
spec_files.py  init, fmt
"""

from gpuplan.cli.main import main

__all__ = ["main"]
