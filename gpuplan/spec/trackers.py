"""The experiment trackers `training.report_to` names: the Trainer's own integrations.

Names and what each needs installed follow transformers 5.24
integrations/integration_utils.py (INTEGRATION_TO_CALLBACK and the is_*_available
checks). "all" is every installed one, "none" none (TrainingArguments.report_to).
kubeflow is left out: the Trainer turns it on by itself from KUBEFLOW_TRAINER_SERVER_URL.
"""

from __future__ import annotations

# name -> (importable modules that must all be present, pip package to install)
TRACKERS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboard",), "tensorboard"),
    "mlflow": (("mlflow",), "mlflow"),
    "wandb": (("wandb",), "wandb"),
    "trackio": (("trackio",), "trackio"),
    "comet_ml": (("comet_ml",), "comet-ml"),
    "neptune": (("neptune",), "neptune"),
    "clearml": (("clearml",), "clearml"),
    "codecarbon": (("codecarbon",), "codecarbon"),
    "dagshub": (("dagshub", "mlflow"), "dagshub mlflow"),
    "dvclive": (("dvclive",), "dvclive"),
    "swanlab": (("swanlab",), "swanlab"),
    "flyte": (("flytekit",), "flytekit flytekitplugins-deck-standard"),
    "azure_ml": (("azureml",), "azureml-core"),
}
TRACKER_NAMES = tuple(TRACKERS)


def installed_trackers() -> dict[str, bool]:
    """Which trackers' modules this machine has, by importlib.util.find_spec: nothing is imported.

    Top-level module names only: find_spec of a dotted name imports its parents."""
    import importlib.util

    found: dict[str, bool] = {}
    for name, (modules, _) in TRACKERS.items():
        found[name] = all(importlib.util.find_spec(m) is not None for m in modules)
    return found


# Where apply points the file-based trackers, inside output.dir (apply/train/arguments.py).
TENSORBOARD_DIR = "tensorboard"  # TENSORBOARD_LOGGING_DIR (TensorBoardCallback)
MLFLOW_DIR = "mlruns"  # MLFLOW_TRACKING_URI = file:<output.dir>/mlruns unless the environment sets one


def requested(report_to: str | list[str]) -> list[str]:
    """The trackers a report_to value names ("all" and "none" name none by themselves)."""
    if isinstance(report_to, str):
        return [] if report_to in ("none", "all") else [report_to]
    return list(dict.fromkeys(report_to))
