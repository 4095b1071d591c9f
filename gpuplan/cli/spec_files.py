"""`gpuplan init` and `gpuplan fmt`: the commands that write specs."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuplan.cli.common import UserError, detect_hardware, report, user_files, write_atomic
from gpuplan.errors import GpuplanError


def cmd_init(args) -> int:
    from gpuplan.init.data_source import data_source
    from gpuplan.init.model_source import model_source
    from gpuplan.init.starter_fit import fitted_starter, next_steps
    from gpuplan.render.notices import log_to

    out = Path(args.out)
    if (out.exists() or out.is_symlink()) and not args.force:
        raise UserError(f"{out} already exists", fix="use --force to overwrite it, or --out to write another file")
    # --data first: a missing local file is known at once, before the model is looked up (on the Hub, perhaps)
    data = data_source(args.data, cwd=Path.cwd(), spec_dir=out.resolve().parent) if args.data else None
    source = model_source(args.model)
    starter = fitted_starter(
        source,
        args.gpu,
        task=args.task,
        spec_path=out.resolve(),
        method=args.method,
        data=data,
        plan=_planner(out),
        objective=getattr(args, "objective", None),
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {out.parent}: {e.strerror or e}", fix="choose a writable --out") from None
    write_atomic(out, starter.text)
    log_to(starter.plan.resolved.output.dir)
    print("\n".join(next_steps(str(out), source, starter, data is not None)))
    warnings = [d for d in starter.plan.diagnostics if d.severity == "warning"]
    if warnings:
        report(warnings, args)
    if args.gpu == "auto" and detect_hardware().is_cpu:
        print(
            f'No GPU detected on this machine: hardware.gpu = "auto" plans for its CPU here. To plan for a GPU: '
            f"gpuplan plan {out} --gpu A100-80GB, or set hardware.gpu in {out} (names: gpuplan gpus)"
        )
    return 0


def _planner(out: Path):
    """Spec text -> Plan, planned as `gpuplan plan` would plan the file at `out` (cli/common.py make_plan)."""
    import hashlib

    from gpuplan.plan.build import plan_spec
    from gpuplan.plan.inputs.environment import local_environment
    from gpuplan.spec.load import LoadedSpec, parse_toml_text

    prices, calibrations = user_files()
    environment = local_environment()
    path = out.resolve()

    def plan(text: str):
        loaded = LoadedSpec(path, parse_toml_text(text, path), hashlib.sha256(text.encode()).hexdigest())
        return plan_spec(loaded, detect=detect_hardware, environment=environment, prices=prices, calibrations=calibrations)

    return plan


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
