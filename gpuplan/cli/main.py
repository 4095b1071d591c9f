"""The gpuplan command: plan, apply, show, validate, schema, gpus, init, fmt.

Exit codes follow Terraform: 0 success, 1 error, 2 (with --detailed-exitcode) when
the plan differs from the last applied state. Heavy imports (torch, transformers)
happen only inside `apply` and `plan --trace`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from gpuplan import __version__
from gpuplan.plan.types import Diagnostic, PlanError
from gpuplan.render.style import Style
from gpuplan.render.text import render_diagnostics

EXAMPLES = {
    "plan": "example: gpuplan plan specs/llama-8b-a100.toml --gpu H100-80GB --json",
    "apply": "example: gpuplan apply specs/tiny.toml --yes",
    "validate": "example: gpuplan validate specs/tiny.toml",
    "schema": "example: gpuplan schema > gpuplan.schema.json",
    "gpus": "example: gpuplan gpus",
    "show": "example: gpuplan show runs/tiny   (or: gpuplan show run.plan.json --json)",
    "init": "example: gpuplan init specs/models/llama-3.1-8b.json --gpu A100-80GB --out llama.toml",
    "fmt": "example: gpuplan fmt --check specs/*.toml",
}


class UserError(Exception):
    """A CLI-level mistake (bad flag combination, missing terminal): exit 1."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuplan", description="Terraform for GPU training runs.",
                                epilog="example: gpuplan plan specs/tiny.toml")
    p.add_argument("--version", action="version", version=f"gpuplan {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, epilog=EXAMPLES[name])

    plan = cmd("plan", "Validate a spec, resolve it for the hardware, and print the changes and memory.")
    plan.add_argument("spec", help="spec file (TOML)")
    _plan_flags(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (format 1)")
    plan.add_argument("--out", metavar="FILE", help="also write the plan JSON to FILE (apply it later)")
    plan.add_argument("--trace", action="store_true",
                      help="also trace two real training steps under FakeTensorMode (imports torch)")
    plan.add_argument("--detailed-exitcode", action="store_true",
                      help="exit 2 when the plan differs from the last apply in the output dir")

    apply = cmd("apply", "Plan (or load a saved plan) and train with transformers.Trainer.")
    apply.add_argument("target", help="spec file (TOML) or saved plan (JSON from plan --out)")
    _plan_flags(apply)
    apply.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    apply.add_argument("--trust-remote-code", action="store_true",
                       help="allow model code from the model directory (the spec must allow it too)")
    apply.add_argument("--restart", action="store_true", help="start over instead of resuming an incompatible run")
    apply.add_argument("--break-lock", action="store_true", help="remove a lock left by a dead process")
    apply.add_argument("--node-rank", type=int, metavar="R",
                       help="several nodes without SLURM: run this node's share (0 = the rendezvous host)")

    val = cmd("validate", "Check a spec against the schema; no hardware or model lookups.")
    val.add_argument("spec")
    show = cmd("show", "Print a saved plan or a run's state (an output dir).")
    show.add_argument("target", help="saved plan (.json) or output dir")
    show.add_argument("--json", action="store_true")
    cmd("schema", "Print the spec's JSON Schema (for Taplo / Even Better TOML).")
    cmd("gpus", "List the hardware catalog.")

    init = cmd("init", "Write a commented starter spec for a model config and a GPU.")
    init.add_argument("model_config", metavar="MODEL_CONFIG", help="a config.json, or a model directory holding one")
    init.add_argument("--gpu", metavar="NAME", default="auto", help='catalog name, "cpu", or "auto" (default: auto)')
    init.add_argument("--task", default="causal-lm", help="causal-lm (default), seq-cls or masked-lm")
    init.add_argument("--out", metavar="FILE", default="gpuplan.toml", help="spec to write (default: gpuplan.toml)")
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")

    fmt = cmd("fmt", "Lay out specs in schema order, keeping comments and values.")
    fmt.add_argument("specs", nargs="+", metavar="SPEC", help='spec files; "-" reads stdin and writes stdout')
    fmt.add_argument("--check", action="store_true", help="write nothing; list the files fmt would change, exit 1 if any")
    return p


def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", metavar="NAME", help='override hardware.gpu (a catalog name, "auto" or "cpu")')
    p.add_argument("--strict", action="store_true", help="refuse to adjust any value the spec sets")
    p.add_argument("--no-color", action="store_true", help="plain text output")


def _style(args, stream) -> Style:
    return Style(False) if getattr(args, "no_color", False) else Style.for_stream(stream)


def _report(diags: Sequence[Diagnostic], args) -> None:
    text = render_diagnostics([d.to_dict() for d in diags], _style(args, sys.stderr))
    print("\n".join(text), file=sys.stderr)


def _detect():
    from gpuplan.hardware.detect import detect  # the CLI edge: detection only when "auto" asks

    return detect()[0]


def make_plan(spec_path: str, args):
    from gpuplan.plan.build import plan_file
    from gpuplan.plan.environment import local_environment

    overrides = {"hardware": {"gpu": args.gpu}} if args.gpu else None
    return plan_file(spec_path, detect=_detect, environment=local_environment(), strict=args.strict,
                     overrides=overrides)


def write_atomic(path: str | Path, text: str) -> None:
    """Write a user-visible file crash-safely; an OS error is a user error, not a traceback."""
    from gpuplan.fsutil import write_text_atomic

    try:
        write_text_atomic(path, text)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None


def cmd_plan(args) -> int:
    from gpuplan.render.json import dumps
    from gpuplan.render.text import render_plan

    from gpuplan.cli_state import drift_since_apply, render_drift

    plan = make_plan(args.spec, args)
    if args.trace:
        from gpuplan.trace.plan import trace_plan

        plan = trace_plan(plan)
    data = plan.to_dict()
    drift = drift_since_apply(plan)
    if args.out:
        write_atomic(args.out, dumps(data))
    if args.json:
        sys.stdout.write(dumps({**data, "since_last_apply": drift}))
    else:
        sys.stdout.write(render_plan(data, _style(args, sys.stdout)))
        print("\n".join(render_drift(drift, plan.value("output.dir"))))
        if args.out:
            print(f"Saved the plan to {args.out}; apply it with: gpuplan apply {args.out}")
    if args.detailed_exitcode and (drift is None or drift["changes"]):
        return 2
    return 0


def cmd_validate(args) -> int:
    from gpuplan.spec.load import load_toml
    from gpuplan.spec.validate import validate_spec

    validate_spec(load_toml(args.spec).raw)
    print(f"{args.spec}: valid")
    return 0


def cmd_schema(args) -> int:
    from gpuplan.spec.schema import Spec

    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpuplan spec (format 1)"
    print(json.dumps(schema, indent=2))
    return 0


def cmd_gpus(args) -> int:
    from gpuplan.hardware.catalog import load_catalog

    print(f"{'name':<12} {'memory':>8} {'cc':>5} {'bf16':>5} {'tf32':>5} {'fp8':>4} {'bf16 TFLOP/s':>13}")
    for name, g in load_catalog().items():
        cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "-"
        tf = g.peak_tflops.get("bf16") or g.peak_tflops.get("fp32")
        print(f"{name:<12} {g.memory_bytes / 1024**3:>6.0f}Gi {cc:>5} {str(g.bf16).lower():>5} "
              f"{str(g.tf32).lower():>5} {str(g.fp8).lower():>4} {tf:>13}")
    return 0


def cmd_show(args) -> int:
    from gpuplan.cli_state import show
    from gpuplan.render.json import dumps

    data, text = show(args.target)
    sys.stdout.write(dumps(data) if args.json else text)
    return 0


def cmd_init(args) -> int:
    from gpuplan.spec.starter import starter_spec

    out = Path(args.out)
    if (out.exists() or out.is_symlink()) and not args.force:
        raise UserError(f"{out} already exists; use --force to overwrite it, or --out to write another file")
    text = starter_spec(Path(args.model_config), args.gpu, task=args.task, spec_dir=out.resolve().parent)
    write_atomic(out, text)
    print(f"Wrote {out}; set data.train_files, then: gpuplan plan {out}")
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
        except PlanError as e:  # report every file's problem, format the others
            errors.extend(e.diagnostics)
            continue
        if out != text:
            changed.append(path)
            if not args.check:
                write_atomic(path, out)
            print(path)
    if errors:
        raise PlanError(errors)
    return int(args.check and bool(changed))


def cmd_apply(args) -> int:
    from gpuplan.cli_apply import run_apply

    return run_apply(args, make_plan=make_plan, style=_style(args, sys.stdout), detect=_detect)


COMMANDS = {"plan": cmd_plan, "apply": cmd_apply, "show": cmd_show, "validate": cmd_validate, "schema": cmd_schema, "gpus": cmd_gpus,
            "init": cmd_init, "fmt": cmd_fmt}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 1
    try:
        return COMMANDS[args.command](args)
    except PlanError as e:
        _report(e.diagnostics, args)
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


if __name__ == "__main__":
    sys.exit(main())
