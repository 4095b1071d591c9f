"""`gpuplan init` and `gpuplan fmt`: the commands that write specs."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuplan.cli.common import UserError, detect_hardware, write_atomic
from gpuplan.errors import GpuplanError


def cmd_init(args) -> int:
    from gpuplan.spec.starter import starter_spec

    out = Path(args.out)
    if (out.exists() or out.is_symlink()) and not args.force:
        raise UserError(f"{out} already exists", fix="use --force to overwrite it, or --out to write another file")
    text = starter_spec(Path(args.model_config), args.gpu, task=args.task, spec_dir=out.resolve().parent)
    write_atomic(out, text)
    print(f"Wrote {out}; set data.train_files, then: gpuplan plan {out}")
    if args.gpu == "auto" and detect_hardware().is_cpu:
        print(f'No GPU detected on this machine: hardware.gpu = "auto" plans for its CPU here. To plan for a GPU: '
              f'gpuplan plan {out} --gpu A100-80GB, or set hardware.gpu in {out} (names: gpuplan gpus)')
    return 0


def cmd_fmt(args) -> int:
    from gpuplan.spec.fmt import format_spec_text, read_spec_text

    if "-" in args.specs:
        if len(args.specs) > 1:
            raise UserError('"-" (stdin) cannot be combined with files')
        text = sys.stdin.read()
        out = format_spec_text(text, source="<stdin>")
        if args.check:
            if out != text:
                print("<stdin>")
            return int(out != text)
        sys.stdout.write(out)
        return 0
    changed, errors = [], []
    for path in args.specs:
        try:
            text = read_spec_text(path)
            out = format_spec_text(text, source=path)
        except GpuplanError as e:  # report every file's problem, format the others
            errors.extend(e.diagnostics)
            continue
        if out != text:
            changed.append(path)
            if not args.check:
                write_atomic(path, out)
            print(path)
    if errors:
        raise GpuplanError(errors)
    return int(args.check and bool(changed))
