"""Kubernetes hand-off (gpuplan/clusters/kubernetes.py): the rendered manifests against the real schemas.

- the Indexed Job and the headless Service against Kubernetes 1.37's own OpenAPI schemas, as
  kubernetes-validate 1.37.0 bundles them, in strict mode (unknown fields refused);
- the TrainJob against the openAPIV3Schema of Kubeflow Trainer v2.3.0's TrainJob CRD
  (tests/clusters/data/kubeflow-trainjob-v2.3.0.schema.json, its source and licence in its $comment),
  closed the way the API server's strict field validation closes it (an unknown field is an error);
- each pod's command run by a real /bin/sh with the variables Kubernetes / Kubeflow set.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuplan.clusters.engine import engine_for
from gpuplan.clusters.job import JobError, job_for
from gpuplan.clusters.kubernetes import status_of
from gpuplan.plan.build import plan_file
from tests.helpers.cluster_launches import IMAGE, MULTI_NODE_SPEC, launch_for
from tests.helpers.planning import ENV

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

K8S_VERSION = "1.37.0"
CRD_SCHEMA = Path(__file__).parent / "data" / "kubeflow-trainjob-v2.3.0.schema.json"


@pytest.fixture(scope="module")
def plan():
    return plan_file(MULTI_NODE_SPEC, environment=ENV)


def rendered(plan, **changes):
    """(job, the rendered files, the documents of the one kubectl submits)."""
    job = job_for(plan, launch_for(plan, "kubernetes", **changes))
    files = engine_for("kubernetes").render(job)
    return job, files, list(yaml.safe_load_all(next(iter(files.values()))))


def closed(schema):
    """The CRD schema with unknown fields refused, as `kubectl apply` (server-side strict field validation) refuses them."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def trainjob_validator():
    schema = closed(json.loads(CRD_SCHEMA.read_text()))
    return jsonschema.Draft7Validator(schema)


def test_trainjob_validates_against_the_kubeflow_crd(plan, trainjob_validator):
    job, files, (tj,) = rendered(plan)
    assert list(files) == ["trainjob.yaml", "job.yaml"]  # the submitted one first, the Indexed Job beside it
    trainjob_validator.validate(tj)
    assert tj["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and tj["kind"] == "TrainJob"
    spec, trainer = tj["spec"], tj["spec"]["trainer"]
    assert spec["runtimeRef"] == {"name": "torch-distributed"}
    assert trainer["numNodes"] == job.nodes == 2 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "8"}
    assert trainer["image"] == IMAGE
    assert tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" and tj["metadata"]["namespace"] == "ml"
    assert spec["activeDeadlineSeconds"] == job.time_limit.seconds
    assert trainer["command"][-len(job.command) :] == list(job.command)
    assert not {e["name"] for e in trainer["env"]} & {
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    }
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "shared-pvc"}} in pod["volumes"]
    assert {"name": "shared", "mountPath": "/shared"} in pod["containers"][0]["volumeMounts"]
    assert job.output_dir.startswith("/shared/")


def test_the_crd_check_can_fail(plan, trainjob_validator):
    _, _, (tj,) = rendered(plan)
    tj["spec"]["trainer"]["numNode"] = tj["spec"]["trainer"].pop("numNodes")  # a typo
    with pytest.raises(jsonschema.ValidationError, match="numNode"):
        trainjob_validator.validate(tj)
    tj["spec"]["trainer"]["numNodes"] = "2"
    del tj["spec"]["trainer"]["numNode"]
    with pytest.raises(jsonschema.ValidationError, match="'2' is not of type 'integer'"):
        trainjob_validator.validate(tj)


def test_indexed_job_and_headless_service_validate_against_kubernetes_schemas(plan):
    job, files, docs = rendered(plan, kubernetes_api="job")
    assert list(files) == ["job.yaml", "trainjob.yaml"] and [d["kind"] for d in docs] == ["Service", "Job"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    service, kjob = docs
    name = job.name
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": name}
    spec = kjob["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert spec["activeDeadlineSeconds"] == job.time_limit.seconds
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == name and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MASTER_ADDR"] == f"{name}-0.{name}"  # pod hostname NAME-0 (index 0) in the Service's subdomain
    assert env["MASTER_PORT"] == str(job.master_port) and env["GPUPLAN_JOB_ID"] == f"kubernetes:ml/job/{name}"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert kjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "shared-pvc"}} in pod["volumes"]


def test_the_kubernetes_check_can_fail(plan):
    _, _, (_, kjob) = rendered(plan, kubernetes_api="job")
    kjob["spec"]["completionMode"] = "indexed"  # the enum is case-sensitive: NonIndexed | Indexed
    kjob["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(kjob, K8S_VERSION, strict=True)


def run_pod_command(command, job, env):
    """The pod's argv as a real /bin/sh runs it, `gpuplan` swapped for a Python that prints MASTER_ADDR and its argv."""
    n = len(job.command)
    probe = [sys.executable, "-c", "import os, sys; print(os.environ.get('MASTER_ADDR'), *sys.argv[1:])"]
    argv = command[:-n] + probe + list(job.command[1:])
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.split()


def test_each_pod_runs_the_saved_plan_with_its_node_rank(plan):
    job, _, (tj,) = rendered(plan)
    out = run_pod_command(tj["spec"]["trainer"]["command"], job, {"PET_NODE_RANK": "1", "PET_MASTER_ADDR": "llama-node-0-0.llama"})
    assert out == ["llama-node-0-0.llama", "apply", job.plan_file, "--yes", "--in-job", "--node-rank", "1"]
    job, _, (_, kjob) = rendered(plan, kubernetes_api="job")
    container = kjob["spec"]["template"]["spec"]["containers"][0]
    env = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": {e["name"]: e["value"] for e in container["env"]}["MASTER_ADDR"]}
    out = run_pod_command(container["command"], job, env)
    assert out == [f"{job.name}-0.{job.name}", "apply", job.plan_file, "--yes", "--in-job", "--node-rank", "1"]


def test_shared_storage_needs_its_claim(plan):
    with pytest.raises(JobError, match="needs the PersistentVolumeClaim") as e:
        rendered(plan, storage_claim=None)
    assert e.value.diagnostics[0].key == "launch.storage_claim"


def test_a_name_kubernetes_refuses_is_refused_with_a_fix(plan):
    with pytest.raises(JobError, match="'8b-run' is not a DNS label that starts with a letter") as e:
        rendered(plan, job_name="8b-run")
    assert e.value.diagnostics[0].key == "launch.job_name" and 'launch.job_name = "run-8b-run"' in (e.value.diagnostics[0].fix or "")


@pytest.mark.parametrize(
    "obj, state, done",
    [
        ({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "Complete", True),
        ({"status": {"conditions": [{"type": "Suspended", "status": "False"}, {"type": "Failed", "status": "True"}]}}, "Failed", True),
        ({"spec": {"suspend": True}, "status": {}}, "Suspended", False),
        ({"status": {"active": 2}}, "Running", False),
        ({"status": {}}, "Pending", False),
    ],
)
def test_status_from_kubectl_json(obj, state, done):
    s = status_of(obj, "kubectl get job")
    assert (s.state, s.done) == (state, done)


def test_missing_kubectl_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without kubectl
    assert "kubectl" in (engine_for("kubernetes").missing_client() or "")
