"""Beyond one machine: a plan handed off to the engines users already run (Slurm, Kubernetes, SkyPilot, Ray).

job.py         the Job a plan becomes: resources, nodes x GPUs, the time limit and its margin, the command
accelerators.py  the GPU types a SkyPilot job lists: those compare finds fitting at the plan's nodes x GPUs, each with its plan
engine.py      an Engine (render, client check, submit, status) and the registry ENGINES (launch.target -> module)
handoff.py     `gpuplan apply` with a [launch] target: write the job dir, submit, record the job id; its status
slurm.py       an sbatch script: srun + torchrun on every node, --gres, --time, requeue on preemption
kubernetes.py  a Kubeflow Trainer TrainJob (torch-distributed runtime), or an Indexed Job + headless Service
skypilot.py    a SkyPilot task YAML run as a managed job, the planned run time handed to its optimizer
ray.py         a Ray Train TorchTrainer script: one worker per node, each running gpuplan apply
yaml_text.py   the YAML those engines read, written without PyYAML
"""

from gpuplan.lazy import lazy_exports

_EXPORTS = {
    "Job": "gpuplan.clusters.job",
    "JobError": "gpuplan.clusters.job",
    "job_for": "gpuplan.clusters.job",
    "Engine": "gpuplan.clusters.engine",
    "engine_for": "gpuplan.clusters.engine",
    "hand_off": "gpuplan.clusters.handoff",
    "remote_status": "gpuplan.clusters.handoff",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
