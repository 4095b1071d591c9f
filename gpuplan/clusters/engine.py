"""An engine a job is handed to (Slurm, Kubernetes, SkyPilot, Ray), and the registry of them.

Each engine lives in its own module, `gpuplan/clusters/<target>.py`, which defines `ENGINE`, an
instance of an Engine subclass; ENGINES maps launch.target to that module, imported only when the
target is used. An engine renders a Job (gpuplan/clusters/job.py) to the engine's own files (pure),
says whether its client is installed, submits with that client, and asks it for a job's status.
What happens around those calls (the job dir, the confirmation, the state record) is handoff.py's.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gpuplan.clusters.job import Job
from gpuplan.errors import OneProblem
from gpuplan.plan.resolved import LaunchSettings

ENGINES: dict[str, str] = {
    "slurm": "gpuplan.clusters.slurm",
    "kubernetes": "gpuplan.clusters.kubernetes",
    "skypilot": "gpuplan.clusters.skypilot",
    "ray": "gpuplan.clusters.ray",
}


class SubmitError(OneProblem):
    """The engine's client refused the job or could not be reached (its own words in the detail)."""


@dataclass(frozen=True)
class RemoteStatus:
    """A submitted job as its engine reports it."""

    state: str  # the engine's own word: PENDING, RUNNING, COMPLETED (Slurm), Succeeded (Kubernetes) ...
    done: bool | None  # finished, either way; None: the engine cannot tell
    source: str  # what was asked: "squeue", "sacct", "kubectl get trainjob" ...
    detail: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"state": self.state, "done": self.done, "source": self.source, "detail": self.detail}


class Engine:
    """One cluster engine. Subclasses set `target` and `client` and implement the four methods (and `address`
    where [launch] names the cluster)."""

    target: ClassVar[str]
    client: ClassVar[str]  # what submits, as errors name it: "sbatch (Slurm's client, Debian package slurm-client)"

    def render(self, job: Job) -> dict[str, str]:
        """{file name: text} for the job dir; pure: no client, no file system."""
        raise NotImplementedError

    def missing_client(self) -> str | None:
        """None when the client is installed here; else what is missing and how to install it."""
        raise NotImplementedError

    def address(self, launch: LaunchSettings) -> str | None:
        """Where the client reaches the cluster when [launch] names it (recorded with the job id, so `gpuplan
        show` asks the cluster the job went to); None: the client's own default (Slurm's, kubectl's context)."""
        return None

    def submit(self, job: Job, files: Mapping[str, Path]) -> str:
        """Submit the rendered files (their paths in the job dir); the engine's job id. SubmitError on refusal."""
        raise NotImplementedError

    def status(self, job_id: str, address: str | None = None) -> RemoteStatus:
        """The job's state as the engine reports it now, asked at `address` (the recorded one); a job it no
        longer knows is a status, not an error."""
        raise NotImplementedError


def engine_for(target: str) -> Engine:
    """The registered engine of launch.target; GpuplanError when this gpuplan has none for it."""
    if target not in ENGINES or importlib.util.find_spec(ENGINES[target]) is None:
        built = [t for t, m in ENGINES.items() if importlib.util.find_spec(m) is not None]
        raise OneProblem(
            f"launch.target = {target!r}: this gpuplan has no {target} engine",
            key="launch.target",
            fix=f"use one it has ({', '.join(built)}), or upgrade gpuplan",
        )
    module = importlib.import_module(ENGINES[target])
    engine = module.ENGINE
    assert isinstance(engine, Engine) and engine.target == target, f"{ENGINES[target]}.ENGINE is not the {target} engine"
    return engine
