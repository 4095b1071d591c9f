"""How a plan's training processes start: one Launcher per backend.

`launcher_for(plan, node_rank, env)` picks the backend from the plan (one process, or
torchrun on one or several nodes, SLURM included: apply/launch/torchrun.py has the commands) and
`Launcher.run` starts it. A new backend is one class here plus its commands in its own
module; the CLI and the orchestration (apply/launch/session.py) only call `run`.

`holds_run` says whether this process owns the run: it takes the output dir's run lock,
decides where to resume and moves old checkpoints. Node 0 (or the only process) does;
another node's torchrun only joins, and printing the commands trains nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuplan.plan.types import Plan


class Launcher:
    """Starts the processes of one apply and waits for them; returns the exit code."""

    holds_run = True  # takes the run lock and decides the resume point (see the module docstring)
    describes = ""  # the prefix of what it prints about resuming ("node 1: ")

    def run(self, plan: Plan, *, resume_from: str | None, echo: Callable[[str], None]) -> int:
        raise NotImplementedError


class InProcess(Launcher):
    """One process: transformers.Trainer in this interpreter (apply/train/execute.py)."""

    def run(self, plan: Plan, *, resume_from: str | None, echo: Callable[[str], None]) -> int:
        from gpuplan.apply.train.execute import execute

        execute(plan, echo=echo, progress=sys.stderr.isatty(), resume_from=resume_from)
        return 0


@dataclass
class Torchrun(Launcher):
    """torchrun on this node, rank 0 of `node_rank`'s group (one node, or node 0 of several)."""

    node_rank: int = 0
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def __post_init__(self) -> None:
        self.holds_run = self.node_rank == 0
        self.describes = "" if self.node_rank == 0 else f"node {self.node_rank}: "

    def run(self, plan: Plan, *, resume_from: str | None, echo: Callable[[str], None]) -> int:
        from gpuplan.apply.launch import torchrun as launch

        argv = launch.launch_command(
            plan,
            launch.save_launch_plan(plan),
            node_rank=self.node_rank,
            env=self.env,
            resume_from=resume_from,
            progress=self.node_rank == 0 and sys.stderr.isatty(),
        )
        return launch.run_torchrun(argv, echo=echo)


@dataclass
class PrintCommands(Launcher):
    """Several nodes and no node rank: print each node's command; nothing trains here."""

    target: str = ""
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    holds_run = False

    def run(self, plan: Plan, *, resume_from: str | None, echo: Callable[[str], None]) -> int:
        from gpuplan.apply.launch import torchrun as launch

        path = launch.save_launch_plan(plan)
        echo("\n".join(launch.node_commands(plan, path, self.target, self.env)))
        return 0


def launcher_for(plan: Plan, target: str, node_rank: int | None, env: Mapping[str, str]) -> Launcher:
    """The backend this plan runs on from this machine (apply/launch/torchrun.py decides the topology)."""
    from gpuplan.apply.launch import torchrun as launch

    multi = launch.decide(plan, node_rank, env)
    if multi is None:
        return InProcess()
    if multi.print_only:
        return PrintCommands(target=target, env=env)
    return Torchrun(node_rank=multi.node_rank, env=env)
