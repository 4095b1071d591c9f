"""Experiment tracking: `training.report_to` names the Trainer's own integrations.

Each named tracker must be installed where the plan is made when the plan is for this
machine (the environment's "trackers", found with importlib.util.find_spec: nothing is
imported); a missing one is an error naming the pip package. A plan for other machines
(plan/inputs/target.py is_local) notes the package instead, and apply checks it there
(apply/launch/packages.py). TensorBoard and MLflow write into output.dir
(apply/train/arguments.py): the plan says where.
"""

from __future__ import annotations

import os

from gpuplan.plan.engine.graph import Rule
from gpuplan.plan.engine.resolver import Resolver
from gpuplan.plan.inputs.target import is_local
from gpuplan.spec.trackers import MLFLOW_DIR, TENSORBOARD_DIR, TRACKERS, requested


def report_to(ctx: Resolver) -> None:
    ctx.keep("training.report_to")
    want = ctx.spec("training.report_to")
    names = requested(want)
    installed = ctx.environment.trackers
    if installed is not None:  # None: the caller did not probe (a plan made from a fixed environment)
        local = is_local(ctx.spec)
        for name in names:
            if installed.get(name):
                continue
            package = TRACKERS[name][1]
            if local:
                ctx.error(
                    "training.report_to",
                    f"training.report_to names {name!r}, which is not installed here",
                    fix=f"pip install {package}, or remove {name!r} from training.report_to",
                )
            else:  # a plan for other machines: apply checks there (apply/launch/packages.py), as for other packages
                ctx.note(
                    "training.report_to",
                    f"training.report_to names {name!r}: it needs the {package} package "
                    "on the training machines (not installed where this plan was made)",
                    fix=f"pip install {package} on every node before `gpuplan apply`",
                )
    out = ctx.spec("output.dir")
    where = []
    if "tensorboard" in names:
        logdir = os.path.join(out, TENSORBOARD_DIR)
        where.append(f"TensorBoard event files in {logdir} (view: tensorboard --logdir {logdir})")
    if "mlflow" in names:
        where.append(
            f"MLflow runs in file:{os.path.join(out, MLFLOW_DIR)} unless MLFLOW_TRACKING_URI is set "
            f"(view: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri file:{os.path.join(out, MLFLOW_DIR)})"
        )
    if want == "all":
        where.append("every installed tracker the Trainer knows")
    if where:
        ctx.note("training.report_to", f"run {ctx.spec('training.run_name')!r} reports to " + "; ".join(where))


RULES = (
    Rule(
        "tracking.report_to",
        reads=("spec:training.report_to", "spec:output.dir", "spec:training.run_name", "spec:hardware.gpu", "spec:hardware.nodes"),
        writes=("training.report_to",),
        apply=report_to,
        doc="report_to trackers are installed; where their logs go.",
    ),
)
