"""What `gpuplan init MODEL` names: a config.json, a model directory or a Hub id.

A Hub id is resolved as `plan` resolves model.name_or_path (gpuplan/plan/inputs/sources.py):
config.json only, from the cache first (huggingface_hub's hf_hub_download, which honours
HF_HUB_OFFLINE), with the same errors. Local paths win over Hub ids, as in specs
(gpuplan/hub/ids.py). huggingface_hub is imported only for a Hub id; never torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan.errors import Diagnostic, GpuplanError
from gpuplan.hub.ids import is_hub_id
from gpuplan.modelinfo import ModelConfigError, read_config

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class ModelSource:
    key: str  # the spec key it is written as: "model.config" or "model.name_or_path"
    path: Path | None  # the local config.json or directory; None for a Hub id
    hub_id: str | None  # the Hub id as given
    name: str  # for the header and output.dir: llama-3.1-8b, my-model, Llama-3.1-8B
    config: dict[str, Any]
    tokenizer_dir: str | None  # where its tokenizer files would be (the directory, the cached snapshot)
    has_weights: bool | None  # None: unknown (a Hub id: planning reads only config.json)

    def value(self, spec_dir: Path) -> str:
        """The value written into the spec: the Hub id, or the path relative to the spec's directory."""
        return self.hub_id if self.hub_id is not None else relative(self.path, spec_dir)  # type: ignore[arg-type]


def model_source(model: str | Path, *, cwd: Path | None = None) -> ModelSource:
    """Read MODEL's config; a Hub id when no such local path exists and it has a repo id's shape."""
    text = str(model)
    here = Path(cwd) if cwd is not None else Path.cwd()
    if isinstance(model, str) and not text.endswith(".json") and is_hub_id(text, here):
        return _hub_source(text, here)
    path = Path(model)
    try:
        config = read_config(path)
    except ModelConfigError as e:
        raise GpuplanError(
            [Diagnostic("error", "model.config", f"model config: {e}", fix="give a config.json, a model directory or a Hub id (org/name)")]
        ) from None
    if path.is_dir():
        weights = any(n.endswith(WEIGHT_SUFFIXES) for n in os.listdir(path))
        return ModelSource("model.name_or_path", path, None, path.name, config, str(path), weights)
    name = path.parent.name if path.name == "config.json" else path.stem
    return ModelSource("model.config", path, None, name, config, None, False)


def _hub_source(repo_id: str, cwd: Path) -> ModelSource:
    from gpuplan.hub.resolve import HubError, resolve

    key = "model.name_or_path"
    try:
        ref = resolve(key, repo_id, "model", "main", None)
        config = read_config(Path(ref.path))
    except HubError as e:  # the Diagnostic plan/inputs/sources.py makes for the same failure
        raise GpuplanError(
            [Diagnostic("error", key, e.message, detail=f"{key} is read as a Hub id: no local path {cwd / repo_id} exists", fix=e.fix)]
        ) from None
    except ModelConfigError as e:
        raise GpuplanError([Diagnostic("error", key, f"{key}: {e}")]) from None
    return ModelSource(key, None, repo_id, repo_id.rsplit("/", 1)[-1], config, os.path.dirname(ref.path), None)


def chat_template_known(source: ModelSource) -> bool | None:
    """Whether MODEL's tokenizer carries a chat template; None when its tokenizer files are not here
    (a config.json alone, a Hub id whose tokenizer is not in the cache)."""
    folder = source.tokenizer_dir
    if folder is None:
        return None
    names = ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")
    if not any(os.path.isfile(os.path.join(folder, n)) for n in names):
        return None if source.hub_id is not None else False
    from gpuplan.plan.rules.chat_data import has_chat_template  # the plan's own check

    return has_chat_template(folder)


def relative(path: Path, spec_dir: Path) -> str:
    """`path` relative to the spec's directory (the pair moves together), absolute when they share only the root."""
    target, base = Path(path).resolve(), Path(spec_dir).resolve()
    try:
        if Path(os.path.commonpath([target, base])) == Path(target.anchor):
            return target.as_posix()
        return Path(os.path.relpath(target, base)).as_posix()
    except ValueError:  # another drive on Windows
        return target.as_posix()
