"""How a plan for several processes is launched: torchrun (torch.distributed.run) argv, SLURM, nodes.

Every rank runs `python -m gpuplan.apply.launch.worker PLAN.json`, the same saved plan; the
Trainer reads RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT that torchrun
sets (torch docs, "torchrun (Elastic Launch)": environment variables). DeepSpeed needs
no launcher of its own here: the Trainer's DeepSpeed integration calls
deepspeed.init_distributed, which reads the same variables (transformers
integrations/deepspeed.py via accelerate), so `deepspeed` / `accelerate launch` are not used.

- One node: `--standalone` (c10d rendezvous on localhost at a free port: two runs on one
  host never collide on a fixed port).
- Several nodes: static rendezvous, `--nnodes N --node_rank R --master_addr A --master_port P`
  (torchrun's default rdzv_backend "static"), one torchrun per node.
- SLURM: `srun --nodes=N --ntasks-per-node=1 gpuplan apply PLAN --yes`; each task reads its
  node rank from SLURM_NODEID and the rendezvous host from MASTER_ADDR or the first host of
  SLURM_JOB_NODELIST (slurm docs, sbatch(1) "OUTPUT ENVIRONMENT VARIABLES").
Pure functions: no torch import, the environment is passed in as a dict.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from gpuplan.apply.errors import ApplyError
from gpuplan.lifecycle.run_dir import LAUNCH_PLAN_FILE
from gpuplan.plan.types import Plan


@dataclass(frozen=True)
class Launch:
    """How this `gpuplan apply` runs a multi-process plan: torchrun for `node_rank`, or only print."""

    node_rank: int
    print_only: bool  # several nodes, no SLURM, no --node-rank: print each node's command


def decide(plan: Plan, node_rank: int | None, env: Mapping[str, str]) -> Launch | None:
    """None: train in this process (one process, or already a torchrun rank: WORLD_SIZE is set)."""
    nodes = plan.resolved.hardware.nodes
    if plan.world_size == 1 or "WORLD_SIZE" in env:
        if node_rank not in (None, 0):
            raise ApplyError(f"--node-rank {node_rank}: the plan runs on one node (hardware.nodes = {nodes})")
        return None
    if nodes == 1:
        if node_rank not in (None, 0):
            raise ApplyError(f"--node-rank {node_rank}: the plan runs on one node (hardware.nodes = 1)")
        return Launch(0, False)
    slurm = slurm_context(env)
    if slurm is not None:
        check_slurm_nodes(plan, env)
        if node_rank is not None and node_rank != slurm[0]:
            raise ApplyError(f"--node-rank {node_rank} but SLURM_NODEID = {slurm[0]}; drop --node-rank under SLURM")
        return Launch(slurm[0], False)
    if node_rank is None:
        return Launch(0, True)
    return Launch(node_rank, False)


def save_launch_plan(plan: Plan) -> str:
    """Write the plan every rank executes into output.dir (atomically); its path."""
    from gpuplan.lifecycle.state import write_json_atomic

    out = plan.resolved.output.dir
    try:
        os.makedirs(out, exist_ok=True)
        path = os.path.abspath(os.path.join(out, LAUNCH_PLAN_FILE))
        write_json_atomic(path, plan.to_dict())
    except OSError as e:
        raise ApplyError(f"output.dir: cannot write {LAUNCH_PLAN_FILE} into {out}: {e}", key="output.dir") from e
    return path


def run_torchrun(argv: list[str], echo=print) -> int:
    """Run torch's launcher, its output streaming to ours; its exit status (130 after Ctrl-C)."""
    echo(f"Launching: {shlex.join(argv)}")
    sys.stdout.flush()
    proc = subprocess.Popen(argv)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # the terminal sent SIGINT to torchrun and the ranks too; let them stop
        try:
            proc.wait(timeout=60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        return 130


def first_host(nodelist: str) -> str:
    """The first hostname of a SLURM hostlist: "gpu[01-04,07],cpu1" -> "gpu01".

    Hostlist syntax (slurm docs, "HOSTLIST EXPRESSION"): comma-separated entries, each a
    prefix with an optional bracketed list of numbers and ranges whose zero padding is kept.
    """
    text = nodelist.strip()
    m = re.match(r"([^,\[\]]*)(?:\[([^\]]*)\])?([^,\[\]]*)", text)
    if not text or m is None or not (m.group(1) or m.group(2)):
        raise ApplyError(f"SLURM_JOB_NODELIST = {nodelist!r} is not a SLURM hostlist; set MASTER_ADDR to the first node's host")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0].strip()
    if not first.isdigit():
        raise ApplyError(f"SLURM_JOB_NODELIST = {nodelist!r}: cannot read the range {ranges!r}; set MASTER_ADDR")
    return f"{prefix}{first}{suffix}"


def slurm_context(env: Mapping[str, str]) -> tuple[int, str] | None:
    """(node rank, rendezvous host) inside a SLURM job step; None outside SLURM.

    Needs one task per node (srun --ntasks-per-node=1): each task starts a torchrun that
    starts hardware.count processes, so SLURM_NTASKS must equal SLURM_NNODES.
    """
    if "SLURM_NODEID" not in env and "SLURM_PROCID" not in env:
        return None
    nnodes, ntasks = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES"), env.get("SLURM_NTASKS")
    if nnodes and ntasks and ntasks != nnodes:
        raise ApplyError(
            f"SLURM runs {ntasks} tasks on {nnodes} nodes; gpuplan needs one task per node "
            "(each starts torchrun for the node's GPUs): srun --ntasks-per-node=1 gpuplan apply ..."
        )
    rank = env.get("SLURM_NODEID") or env.get("SLURM_PROCID")
    if rank is None or not rank.isdigit():
        raise ApplyError(f"SLURM_NODEID = {rank!r} is not a node index")
    host = env.get("MASTER_ADDR")
    if not host:
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ApplyError("inside SLURM but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; export MASTER_ADDR")
        host = first_host(nodelist)
    return int(rank), host


def check_slurm_nodes(plan: Plan, env: Mapping[str, str]) -> None:
    nnodes = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    nodes = plan.resolved.hardware.nodes
    if nnodes and nnodes.isdigit() and int(nnodes) != nodes:
        raise ApplyError(
            f"the plan is for hardware.nodes = {nodes} but this SLURM job has {nnodes} node(s) (SLURM_NNODES); "
            f"allocate {nodes} node(s) (sbatch --nodes={nodes}) or re-plan with hardware.nodes = {nnodes}"
        )


def master_addr(plan: Plan, env: Mapping[str, str]) -> str:
    """distributed.master_addr, else SLURM's first node, else MASTER_ADDR; an error for several nodes without one."""
    addr = plan.resolved.distributed.master_addr
    if addr:
        return str(addr)
    slurm = slurm_context(env)
    if slurm is not None:
        return slurm[1]
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    raise ApplyError(
        f"hardware.nodes = {plan.resolved.hardware.nodes}: the nodes need a rendezvous host; set "
        'distributed.master_addr = "<node 0\'s hostname>" in the spec (or export MASTER_ADDR), then re-plan'
    )


def launch_command(
    plan: Plan,
    plan_path: str,
    *,
    node_rank: int,
    env: Mapping[str, str],
    python: str = sys.executable,
    resume_from: str | None = None,
    progress: bool = False,
) -> list[str]:
    """The torchrun argv that runs the saved plan on this node's hardware.count processes."""
    nodes = plan.resolved.hardware.nodes
    count = plan.resolved.hardware.count
    if not 0 <= node_rank < nodes:
        raise ApplyError(f"--node-rank {node_rank}: the plan has hardware.nodes = {nodes}, so it must be 0..{nodes - 1}")
    argv = [python, "-m", "torch.distributed.run", f"--nproc_per_node={count}"]
    if nodes == 1:
        argv += ["--standalone", "--nnodes=1"]
    else:
        port = plan.resolved.distributed.master_port
        argv += [f"--nnodes={nodes}", f"--node_rank={node_rank}", f"--master_addr={master_addr(plan, env)}", f"--master_port={port}"]
    argv += ["-m", "gpuplan.apply.launch.worker", plan_path]
    if resume_from:
        argv += ["--resume-from", resume_from]
    if progress:
        argv.append("--progress")
    return argv


def node_commands(plan: Plan, plan_path: str, target: str, env: Mapping[str, str]) -> list[str]:
    """What to run on each node when there is no SLURM: one block per node rank."""
    nodes, count = plan.resolved.hardware.nodes, plan.resolved.hardware.count
    addr = master_addr(plan, env)
    lines = [
        f"This plan runs on {nodes} nodes x {count} processes ({nodes * count} ranks); "
        f"rendezvous at {addr}:{plan.resolved.distributed.master_port} (node 0).",
        "Nothing was trained. Run on each node (node 0 first; the same paths on every node):",
    ]
    for r in range(nodes):
        lines.append(f"  node {r}: gpuplan apply {shlex.quote(target)} --node-rank {r} --yes")
        lines.append(f"          which runs: {shlex.join(launch_command(plan, plan_path, node_rank=r, env=env))}")
    lines.append(f"Under SLURM: srun --nodes={nodes} --ntasks-per-node=1 gpuplan apply {shlex.quote(target)} --yes")
    return lines
