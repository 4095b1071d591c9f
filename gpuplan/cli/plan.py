"""`gpuplan plan`, `validate`, `schema` and `gpus`: the commands that read a spec or the catalog."""

from __future__ import annotations

import json
import sys

from gpuplan.cli.common import make_plan, style_for, write_atomic


def cmd_plan(args) -> int:
    from gpuplan.cli.state import drift_since_apply
    from gpuplan.render.json import dumps
    from gpuplan.render.state import render_drift
    from gpuplan.render.text import render_plan

    plan = make_plan(args.spec, args)
    if args.trace:
        from gpuplan.render.notices import log_to
        from gpuplan.trace.plan import trace_plan

        log_to(plan.resolved.output.dir, load_libraries=True)

        plan = trace_plan(plan)
    data = plan.to_dict()
    drift = drift_since_apply(plan)
    job = None
    if plan.resolved.launch.remote:  # the job apply would submit; refused here (exit 1) when it cannot be
        from gpuplan.clusters.job import job_for

        job = job_for(plan)
    if args.out:
        write_atomic(args.out, dumps(data))
    if args.json:
        sys.stdout.write(dumps({**data, "since_last_apply": drift, **({"job": job.to_dict()} if job else {})}))
    else:
        sys.stdout.write(render_plan(data, style_for(args, sys.stdout)))
        if job:
            print("\n".join(["", *job.lines(), f"  gpuplan apply {args.spec} submits it; --dry-run writes it without submitting"]))
        print("\n".join(render_drift(drift, plan.resolved.output.dir)))
        if args.out:
            print(f"Saved the plan to {args.out}; apply it with: gpuplan apply {args.out}")
    if args.detailed_exitcode and (drift is None or drift["changes"]):
        return 2
    return 0


def cmd_validate(args) -> int:
    from gpuplan.plan.checks.data_files import data_file_problems
    from gpuplan.plan.types import PlanError
    from gpuplan.spec.load import load_toml
    from gpuplan.spec.validate import validate_spec

    loaded = load_toml(args.spec)
    spec = validate_spec(loaded.raw)
    here = loaded.path.parent
    files = {
        "data.train_files": [str((here / f).resolve()) for f in spec.data.train_files],
        "data.eval_files": [str((here / f).resolve()) for f in spec.data.eval_files],
    }
    if problems := data_file_problems(files, str(here)):  # paths relative to the spec, as plan reads them
        raise PlanError(problems)
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
    from gpuplan.render.catalog import render_catalog

    print("\n".join(render_catalog()))
    return 0
