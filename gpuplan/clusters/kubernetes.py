"""Kubernetes: a Kubeflow Trainer TrainJob, or an Indexed Job + headless Service where Kubeflow is not installed.

Both run one pod per node, each `gpuplan apply` of the saved plan with its node rank (which starts
torchrun for the node's GPUs, apply/launch/torchrun.py), the job's shared storage mounted from a
PersistentVolumeClaim at launch.storage, and Kueue's queue label when launch.queue is set.

- launch.kubernetes_api = "trainjob": `trainer.kubeflow.org/v1alpha1` TrainJob against the
  `torch-distributed` ClusterTrainingRuntime (kubeflow/trainer v2.3.0,
  charts/kubeflow-trainer/files/runtimes/torch-distributed.yaml). Its torch plugin
  (pkg/runtime/framework/plugins/torch/torch.go) sets PET_NODE_RANK from the pod's Job completion
  index and PET_MASTER_ADDR to node 0's pod name; the volumes go in through `runtimePatches`
  (container "node" of replicated job "node", the runtime's names). PET_* names are reserved
  (constants.TorchRunReservedEnvNames): they are read, never set.
- launch.kubernetes_api = "job": a batch/v1 Job with completionMode Indexed, completions = parallelism =
  nodes; each pod's JOB_COMPLETION_INDEX is its node rank, and its hostname NAME-INDEX resolves through
  the headless Service NAME named as the pods' subdomain, so node 0 is reachable as NAME-0.NAME
  (kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/).
  A pod killed by a preemption or a drain carries the DisruptionTarget condition and is ignored by the
  pod failure policy (not counted against backoffLimit: kubernetes.io/docs/concepts/workloads/controllers/job/
  #pod-failure-policy); when one node fails its peers' ranks fail too, so backoffLimit allows every node
  RESTARTS_PER_NODE restarts, and the restarted pods resume from the last checkpoint.

Both carry activeDeadlineSeconds = the job's time limit (clusters/job.py). Both are written into the job
dir; `kubectl apply` submits launch.kubernetes_api's, and the job id is "NAMESPACE/KIND/NAME", which
`kubectl get` answers for `gpuplan show`.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuplan.clusters.engine import Engine, RemoteStatus, SubmitError
from gpuplan.clusters.job import Job, JobError
from gpuplan.clusters.yaml_text import dump, dump_all
from gpuplan.lifecycle.run_lock import JOB_ID_ENV

TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
TORCH_RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime Kubeflow Trainer installs for PyTorch
RUNTIME_JOB = "node"  # its replicated job and its trainer container (constants.Node)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # kueue.sigs.k8s.io/docs/concepts/local_queue/
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource name
RESTARTS_PER_NODE = 3
STORAGE_VOLUME = "shared"
SHM_VOLUME = "dshm"  # torch's DataLoader workers and NCCL pass tensors through /dev/shm, 64 MiB in a container by default
DEFAULT_NAMESPACE = "default"
TRAINJOB_FILE = "trainjob.yaml"
JOB_FILE = "job.yaml"  # the Indexed Job and its headless Service
_RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def namespace(job: Job) -> str:
    return job.launch.namespace or DEFAULT_NAMESPACE


def kind(job: Job) -> str:
    return "trainjob" if job.launch.kubernetes_api == "trainjob" else "job"


def job_id(job: Job) -> str:
    """What `kubectl get` needs to find the job again: NAMESPACE/KIND/NAME."""
    return f"{namespace(job)}/{kind(job)}/{job.name}"


def check(job: Job) -> None:
    """What the API server would refuse, said before anything is written."""
    if not job.launch.image:
        raise JobError('launch.target = "kubernetes" needs launch.image', key="launch.image", fix='set launch.image = "registry/name:tag"')
    if job.storage and not job.launch.storage_claim:
        raise JobError(
            f"launch.storage = {job.storage!r} on Kubernetes needs the PersistentVolumeClaim that holds it",
            key="launch.storage_claim",
            fix='set launch.storage_claim to the name of a ReadWriteMany PVC in the namespace ("shared-pvc")',
        )
    if not _RFC1035.fullmatch(job.name):
        # TrainJob's CEL rule (RFC 1035: a letter first); the Job's pods are named NAME-INDEX too
        raise JobError(
            f"job name {job.name!r} is not a DNS label that starts with a letter (Kubernetes names pods and the TrainJob after it)",
            key="launch.job_name",
            fix=f'set launch.job_name = "{_letter_first(job.name)}"',
        )


def _letter_first(name: str) -> str:
    return name if name[:1].isalpha() else f"run-{name}"[:50].rstrip("-")


def labels(job: Job) -> dict[str, str]:
    out = {"app.kubernetes.io/name": job.name, "app.kubernetes.io/managed-by": "gpuplan"}
    if job.launch.queue:
        out[KUEUE_QUEUE_LABEL] = job.launch.queue
    return out


def resources(job: Job) -> dict[str, Any]:
    """Per node: the GPUs as a limit (an extended resource is asked for by its limit), CPUs and host RAM as requests."""
    r = job.resources
    requests: dict[str, str] = {"cpu": str(r.cpus_per_node)}
    if r.memory_gib_per_node:
        requests["memory"] = f"{math.ceil(r.memory_gib_per_node)}Gi"
    out: dict[str, Any] = {"requests": requests}
    if r.gpus_per_node:
        out["limits"] = {GPU_RESOURCE: str(r.gpus_per_node)}
    return out


def node_script(rank_var: str, master_var: str | None) -> str:
    """The shell line each pod runs: the job's command ("$@") with its node rank read from `rank_var`."""
    export = f'export MASTER_ADDR="${master_var}"; ' if master_var else ""
    return f'{export}exec "$@" --node-rank "${rank_var}"'


def env_list(job: Job, extra: Mapping[str, str]) -> list[dict[str, str]]:
    env = {**job.env, JOB_ID_ENV: f"kubernetes:{job_id(job)}", **extra}
    return [{"name": k, "value": v} for k, v in env.items()]


def volumes(job: Job) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the shared storage's claim at launch.storage, and a RAM-backed /dev/shm."""
    vols: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if job.storage:
        vols.insert(0, {"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": job.launch.storage_claim}})
        mounts.insert(0, {"name": STORAGE_VOLUME, "mountPath": job.storage})
    return vols, mounts


def trainjob(job: Job) -> dict[str, Any]:
    """The Kubeflow Trainer TrainJob (v1alpha1) against the torch-distributed runtime."""
    check(job)
    vols, mounts = volumes(job)
    container = {"name": RUNTIME_JOB, "volumeMounts": mounts}
    pod = {"spec": {"volumes": vols, "containers": [container]}}
    return {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": {"name": job.name, "namespace": namespace(job), "labels": labels(job)},
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME},
            "activeDeadlineSeconds": job.time_limit.seconds,
            "trainer": {
                "image": job.launch.image,
                "command": ["/bin/sh", "-c", node_script("PET_NODE_RANK", "PET_MASTER_ADDR"), "gpuplan-node", *job.command],
                "numNodes": job.nodes,
                "numProcPerNode": job.resources.processes_per_node,
                "resourcesPerNode": resources(job),
                "env": env_list(job, {"MASTER_PORT": str(job.master_port)}),
            },
            "runtimePatches": [
                {
                    "manager": "gpuplan",
                    "trainingRuntimeSpec": {
                        "template": {"spec": {"replicatedJobs": [{"name": RUNTIME_JOB, "template": {"spec": {"template": pod}}}]}}
                    },
                }
            ],
        },
    }


def headless_service(job: Job) -> dict[str, Any]:
    """DNS for the Job's pods: NAME-INDEX.NAME, ready or not (the rendezvous starts before any probe)."""
    check(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": job.name, "namespace": namespace(job), "labels": labels(job)},
        "spec": {
            "clusterIP": "None",
            "selector": {"job-name": job.name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": job.master_port, "targetPort": job.master_port}],
        },
    }


def indexed_job(job: Job) -> dict[str, Any]:
    """The batch/v1 Indexed Job: one pod per node, JOB_COMPLETION_INDEX its node rank, node 0 at NAME-0.NAME."""
    check(job)
    vols, mounts = volumes(job)
    head = f"{job.name}-0.{job.name}"
    container = {
        "name": "gpuplan",
        "image": job.launch.image,
        "command": ["/bin/sh", "-c", node_script("JOB_COMPLETION_INDEX", None), "gpuplan-node", *job.command],
        "env": env_list(job, {"MASTER_ADDR": head, "MASTER_PORT": str(job.master_port)}),
        "ports": [{"containerPort": job.master_port, "name": "rendezvous"}],
        "resources": resources(job),
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job.name, "namespace": namespace(job), "labels": labels(job)},
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nodes,
            "parallelism": job.nodes,
            "backoffLimit": RESTARTS_PER_NODE * job.nodes,
            "activeDeadlineSeconds": job.time_limit.seconds,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "template": {
                "metadata": {"labels": labels(job)},
                "spec": {
                    "subdomain": job.name,
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": vols,
                },
            },
        },
    }


def submitted_file(job: Job) -> str:
    """The rendered file `kubectl apply` submits: launch.kubernetes_api's."""
    return TRAINJOB_FILE if kind(job) == "trainjob" else JOB_FILE


class KubernetesEngine(Engine):
    target = "kubernetes"
    client = "kubectl"

    def render(self, job: Job) -> dict[str, str]:
        """Both forms, launch.kubernetes_api's first: the one submitted, and the other for a cluster
        with (or without) Kubeflow Trainer, from the same saved plan."""
        files = {TRAINJOB_FILE: dump(trainjob(job)), JOB_FILE: dump_all([headless_service(job), indexed_job(job)])}
        first = submitted_file(job)
        return {first: files[first], **{n: t for n, t in files.items() if n != first}}

    def missing_client(self) -> str | None:
        if shutil.which("kubectl") is None:
            return "kubectl, Kubernetes' client, is not on PATH (kubernetes.io/docs/tasks/tools/)"
        return None

    def submit(self, job: Job, files: Mapping[str, Path]) -> str:
        path = files[submitted_file(job)]
        proc = subprocess.run(["kubectl", "apply", "-f", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SubmitError(f"kubectl apply -f {path} failed (exit {proc.returncode})", detail=proc.stderr.strip() or None)
        return job_id(job)

    def status(self, job_id: str, address: str | None = None) -> RemoteStatus:
        ns, what, name = job_id.split("/", 2)
        source = f"kubectl get {what}"
        proc = subprocess.run(["kubectl", "get", what, name, "-n", ns, "-o", "json"], capture_output=True, text=True)
        if proc.returncode != 0:
            text = proc.stderr.strip()
            state = "not found" if "NotFound" in text else "unknown"
            return RemoteStatus(state=state, done=None, source=source, detail=text or None)
        return status_of(json.loads(proc.stdout), source)


def status_of(obj: Mapping[str, Any], source: str) -> RemoteStatus:
    """A Job's or TrainJob's state from its status: the condition that is True last, else what its pods do."""
    status = obj.get("status") or {}
    true = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    finished = {"Complete": True, "Failed": True, "SuccessCriteriaMet": True, "FailureTarget": True}
    if true:
        last = true[-1]
        return RemoteStatus(
            state=str(last.get("type")), done=finished.get(str(last.get("type")), False), source=source, detail=last.get("message")
        )
    if (obj.get("spec") or {}).get("suspend"):
        return RemoteStatus(state="Suspended", done=False, source=source, detail="waiting for admission (Kueue) or suspended")
    active = int(status.get("active") or 0)
    return RemoteStatus(
        state="Running" if active else "Pending", done=False, source=source, detail=f"{active} pod(s) active" if active else None
    )


ENGINE = KubernetesEngine()
