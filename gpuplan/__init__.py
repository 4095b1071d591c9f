"""gpuplan: Terraform for GPU training runs.

spec/ (TOML in) -> plan/ (a Plan: settings with reasons, memory, throughput) ->
render/ (text, JSON) -> apply/ (transformers.Trainer runs it); hardware/ and
modelinfo/ are inputs to planning; cli/ is the command line. Only apply/ and
trace/ import torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
